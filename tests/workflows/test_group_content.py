"""Real episodes of every shipped workflow pass the dataflow's content checks.

The checks (:mod:`astraflow.actors.group_checks`) refuse what no engine of the job produces;
a workflow whose declarations (reward ranges, group sizes, turn budgets) were wrong would
have its real groups refused. Each workflow runs here on the cached tiny model's CPU engine,
its result becomes the groups a RaaS node writes (``EpisodeRunner.group``), and every group
is checked against the limits the dataflow derives from the job config.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from astraflow.actors.episodes import EpisodeRunner
from astraflow.actors.group_checks import impossible, limits_for
from astraflow.config import JobConfig, from_dict
from astraflow.topics import Task
from astraflow.workflows.api import Episode, EngineRole, get_workflow, run_episode
from astraflow.workflows.code_tasks import code_prompts

N = 3


@pytest.mark.parametrize("name", ["rlvr", "solver_verifier", "code_solver_selector", "code_solver_testgen"])
def test_real_episodes_pass_the_content_checks(name, tokenizer_and_engine):
    tok, engine = tokenizer_and_engine
    cfg = from_dict(JobConfig, {"job": "content", "workflow": {"name": name}, "rollout": {"n_samples": N}})
    spec = get_workflow(name)
    if name.startswith("code_"):
        p = code_prompts(1, seed=21)[0]
        prompt, answer, meta = p.text, p.answer, p.metadata
    else:
        prompt, answer, meta = "12+34=", "46", {}
    r = cfg.rollout
    sampling = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": r.max_new_tokens}
    roles = {role: EngineRole(role, cfg.policy, engine, tok, sampling) for role in spec.roles}
    multi = len(cfg.role_policies) > 1
    task = Task("t0000000-p", "p", cfg.policy, prompt, answer, N, sampling, workflow=name,
                role=spec.roles[0], roles=dict(cfg.role_policies) if multi else {}, metadata=dict(meta))
    checked = 0
    for seed in range(3):
        result = run_episode(spec, Episode(task.task_id, prompt, answer, N, roles, tok, {}, meta), job_seed=seed)
        prompt_ids = list(tok.encode(prompt, add_special_tokens=False))
        limits = limits_for(cfg, cfg.policy)
        for role in spec.roles:
            g = EpisodeRunner.group(SimpleNamespace(node_id="raas-0"), task, role, task.roles or {role: cfg.policy},
                                    prompt_ids, result, 0.0)
            assert g.status == "ok", g.error
            assert impossible(g, limits, prompt_bytes=len(prompt.encode()), n_samples=N) is None, (role, g)
            checked += 1
    assert checked == 3 * len(spec.roles)
