"""A chat model's job end to end: prompts rendered once by the dataflow, tasks carry token ids.

``examples/smollm2_chat_arithmetic.yaml`` on ``smol_random`` (SmolLM2's real tokenizer and
ChatML template on a 2-layer random Llama), cut to two versions: every task on the topic
carries the ids the template renders for its prompt (so no node re-tokenizes text), the
trajectories' groups were sampled from exactly those ids, the evaluator recorded every
held-out problem's reward at both versions, and the conservation audit passes.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from astraflow.config import load_config
from astraflow.launcher import run_job
from astraflow.topics import Task, TrajectoryGroup, job_topics
from astraflow.topics.replay import read_topic
from astraflow.workflows.chat import prompt_messages, render

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BRIEF = {"trainer.steps": 2, "trainer.checkpoint_every": 1, "trainer.snapshot_every": 1,
         "dataflow.groups_per_batch": 2, "rollout.n_samples": 2, "rollout.tasks_per_call": 2,
         "rollout.max_new_tokens": 6, "rollout.heartbeat_s": 1.0, "eval.problems": 4, "eval.every": 0,
         "trainer.engine.threads": 1}  # the example trains on both cores; here other tests share them


@pytest.mark.timeout(900)
def test_a_chat_job_carries_rendered_prompt_ids_and_keeps_the_conservation_law(bootstrap, smol_random, tmp_path):
    sets = {**BRIEF, "job": f"chat-{uuid.uuid4().hex[:8]}", "model.name": None, "model.path": str(smol_random)}
    cfg = load_config(ROOT / "examples" / "smollm2_chat_arithmetic.yaml", sets)
    summary = run_job(cfg, bootstrap=bootstrap, overrides=[f"{k}={'null' if v is None else v}" for k, v in sets.items()],
                      run_dir=tmp_path / "run", progress=False, timeout_s=800)
    assert summary["steps_trained"] == 2 and summary["audit"]["ok"], summary.get("audit")
    topics = job_topics(cfg)
    tasks = [m for _, _, m in read_topic(bootstrap, topics.tasks(cfg.policy)) if isinstance(m, Task)]
    assert len(tasks) >= 4
    tok = AutoTokenizer.from_pretrained(str(smol_random))
    for task in tasks:
        assert task.prompt.startswith("What is ") and task.prompt_ids == render(tok, prompt_messages(task.prompt))
    by_id = {t.task_id: t for t in tasks}
    groups = [m for _, _, m in read_topic(bootstrap, topics.trajectories) if isinstance(m, TrajectoryGroup)]
    assert groups and all(list(g.prompt_ids) == by_id[g.task_id].prompt_ids for g in groups)
    per_problem = summary["eval_task_reward_by_version"]
    assert sorted(per_problem, key=int) == ["0", "2"] and all(len(v) == 4 for v in per_problem.values())
