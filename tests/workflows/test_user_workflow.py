"""A user workflow, registered from the job's ``workflow.module`` exactly as docs/workflows.md shows."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest

from astraflow.config import ConfigError, from_dict, JobConfig

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"


@pytest.fixture
def readme_module(tmp_path, monkeypatch):
    text = GUIDE.read_text()
    code = re.search(r"```python\n(# my_workflows\.py.*?)```", text, re.S).group(1)
    (tmp_path / "my_workflows.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_workflows"
    sys.modules.pop("my_workflows", None)


def test_the_readme_workflow_registers_binds_and_runs(readme_module, tmp_path):
    cfg = from_dict(JobConfig, {"job": "user-wf", "policies": {"writer": {}, "critic": {}},
                                "workflow": {"name": "critic_loop", "module": readme_module,
                                             "roles": {"writer": "writer", "critic": "critic"}}})
    assert cfg.lead_policy == "writer" and cfg.role_policies == {"writer": "writer", "critic": "critic"}

    from transformers import AutoTokenizer

    from astraflow.actors.episodes import EpisodeRunner
    from astraflow.models.bootstrap import ensure_tiny_model
    from astraflow.engines.cpu import CpuEngine
    from astraflow.topics import Task
    path = ensure_tiny_model()
    engine = CpuEngine(path)
    try:
        # both roles on this node's engine (one policy playing both), as a test shortcut
        runner = EpisodeRunner("p", "n", engine, AutoTokenizer.from_pretrained(str(path)), 0,
                               engine_lock=threading.Lock())
        (groups,) = runner.run([Task("t1", "p1", "p", "ab", "AB", 3, {"max_new_tokens": 4}, workflow="critic_loop",
                                     roles={"writer": "p", "critic": "p"}, train=["writer", "critic"])])
    finally:
        engine.close()
    assert [g.role for g in groups] == ["writer", "critic"] and all(len(g.samples) == 3 for g in groups)


def test_unbound_or_unknown_roles_are_config_errors(readme_module):
    base = {"job": "user-wf", "policies": {"writer": {}, "critic": {}},
            "workflow": {"name": "critic_loop", "module": readme_module, "roles": {"writer": "writer"}}}
    with pytest.raises(ConfigError, match="workflow.roles.critic"):
        from_dict(JobConfig, base)
    base["workflow"]["roles"] = {"writer": "writer", "critic": "critic", "judge": "writer"}
    with pytest.raises(ConfigError, match="workflow.roles.judge: workflow 'critic_loop' has no role"):
        from_dict(JobConfig, base)
    base["workflow"] = {"name": "nope"}
    with pytest.raises(ConfigError, match="workflow.name: unknown workflow 'nope'"):
        from_dict(JobConfig, base)
    with pytest.raises(ConfigError, match="policies.critic: no workflow role is bound"):
        from_dict(JobConfig, {"job": "x", "policies": {"writer": {}, "critic": {}},
                              "workflow": {"name": "rlvr", "roles": {"solver": "writer"}}})
    with pytest.raises(ConfigError, match="policies.writer.rolout: unknown key"):
        from_dict(JobConfig, {"job": "x", "policies": {"writer": {"rolout": {}}}})


def test_a_mistyped_reward_name_is_a_config_error_before_anything_starts():
    # It used to pass `config check` and fail every episode of the run instead.
    with pytest.raises(ConfigError, match=r"workflow.params.reward: unknown reward 'nosuch' \(registered: .*exact_match"):
        from_dict(JobConfig, {"job": "x", "workflow": {"name": "rlvr", "params": {"reward": "nosuch"}}})
    assert from_dict(JobConfig, {"job": "x", "workflow": {"name": "rlvr", "params": {"reward": "exact_match"}}})
