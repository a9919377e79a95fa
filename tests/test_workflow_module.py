"""``workflow.module`` is found beside the config file (not only on PYTHONPATH), and a bad one
is a config error naming the key and the file, in ``load_config`` and ``astraflow config check``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from astraflow.config import load_config
from astraflow.errors import EXIT_FATAL
from astraflow.typed_config import ConfigError

MODULE = '''
from astraflow.workflows.api import get_workflow, reward, workflow


@workflow("{name}", roles=("solver",))
def episode(ep):
    return get_workflow("rlvr").fn(ep)
'''


def _config(path, **workflow) -> str:
    path.write_text(yaml.safe_dump({"job": "wfmod", "workflow": workflow}))
    return str(path)


def test_a_module_beside_the_config_file_registers_its_workflow(tmp_path, monkeypatch):
    cfg_dir = tmp_path / "jobs"
    (cfg_dir / "mine").mkdir(parents=True)
    (cfg_dir / "mine" / "__init__.py").write_text("")
    (cfg_dir / "mine" / "flows.py").write_text(MODULE.format(name="test_beside_config"))
    (cfg_dir / "single.py").write_text(MODULE.format(name="test_from_a_file"))
    monkeypatch.chdir(tmp_path)  # neither the cwd nor PYTHONPATH holds them
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        cfg = load_config(_config(cfg_dir / "job.yaml", name="test_beside_config", module="mine.flows"))
        assert cfg.workflow.name == "test_beside_config"
        cfg = load_config(_config(cfg_dir / "job2.yaml", name="test_from_a_file", module="single.py"))
        assert cfg.workflow.name == "test_from_a_file"
    finally:
        for name in [m for m in sys.modules if m == "mine" or m.startswith("mine.")]:
            del sys.modules[name]


def test_a_missing_or_broken_module_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ConfigError, match=r"job.yaml: workflow.module: cannot import 'nosuch_mod_x': "
                                          r"ModuleNotFoundError"):
        load_config(_config(tmp_path / "job.yaml", module="nosuch_mod_x"))
    (tmp_path / "broken_mod_x.py").write_text("raise ValueError('half-written')\n")
    with pytest.raises(ConfigError, match=r"workflow.module: cannot import 'broken_mod_x': ValueError: half-written"):
        load_config(_config(tmp_path / "job.yaml", module="broken_mod_x"))
    with pytest.raises(ConfigError, match=r"workflow.module: cannot import 'gone.py': FileNotFoundError: no file"):
        load_config(_config(tmp_path / "job.yaml", module="gone.py"))


def test_config_check_resolves_the_workflow_and_its_module(tmp_path):
    def check(path: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "astraflow", "config", "check", path], capture_output=True,
                              text=True, timeout=120, cwd="/", stdin=subprocess.DEVNULL)

    r = check(_config(tmp_path / "a.yaml", name="nosuch_workflow"))
    assert r.returncode == EXIT_FATAL and "Traceback" not in r.stderr, r.stderr
    assert "workflow.name: unknown workflow 'nosuch_workflow'" in r.stderr.splitlines()[-1]
    (tmp_path / "flows_for_check.py").write_text(MODULE.format(name="test_checked"))
    r = check(_config(tmp_path / "b.yaml", name="test_checked", module="flows_for_check"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1].endswith("b.yaml: valid")


def test_a_mistyped_reward_fails_run_and_config_check_at_once(tmp_path):
    """The issue's case: `reward: nosuch` used to pass `config check` and hang `astraflow run` at 0/N."""
    path = _config(tmp_path / "job.yaml", name="rlvr", params={"reward": "nosuch"})
    for cmd in (["config", "check", path], ["run", path, "--run-dir", str(tmp_path / "run")]):
        r = subprocess.run([sys.executable, "-m", "astraflow", *cmd], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == EXIT_FATAL and "Traceback" not in r.stderr, r.stderr
        assert "workflow.params.reward: unknown reward 'nosuch'" in r.stderr.splitlines()[-1], r.stderr
    assert not (tmp_path / "run").exists()  # nothing started


AGENT = '''
def run(base_url, task):
    return 1.0
'''


def test_an_agent_beside_the_config_file_resolves_as_workflow_module_does(tmp_path, monkeypatch):
    """``workflow.params.agent: my_agent:run`` with my_agent.py beside the job's YAML, run from
    another directory: found in the config's folder at load (it said ``No module named
    'my_agent'``), and the node's own lookup at episode time finds the same function."""
    from astraflow.workflows.openai_endpoint import OpenAIAgentParams, load_agent
    cfg_dir = tmp_path / "jobs"
    cfg_dir.mkdir()
    (cfg_dir / "agent_beside_cfg.py").write_text(AGENT)
    (cfg_dir / "agent_pkg_beside").mkdir()
    (cfg_dir / "agent_pkg_beside" / "__init__.py").write_text("")
    (cfg_dir / "agent_pkg_beside" / "loop.py").write_text(AGENT)
    monkeypatch.chdir(tmp_path)  # neither the cwd nor PYTHONPATH holds them
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        for spec in ("agent_beside_cfg:run", "agent_pkg_beside.loop:run"):
            cfg = load_config(_config(cfg_dir / "job.yaml", name="openai_agent", params={"agent": spec}))
            assert cfg.workflow.params["agent"] == spec
            fn = load_agent(OpenAIAgentParams.of(cfg.workflow.params).agent)  # as the episode looks it up
            assert fn(None, {}) == 1.0 and fn.__module__ == spec.partition(":")[0]
            assert fn is load_agent(spec, cfg.source)
        # the same directory rule as workflow.module, and the same error for a missing one
        with pytest.raises(ConfigError, match=r"workflow.params.agent: cannot import the module of "
                                              r"'agent_nowhere:run': No module named 'agent_nowhere'"):
            load_config(_config(cfg_dir / "job.yaml", name="openai_agent", params={"agent": "agent_nowhere:run"}))
    finally:
        for name in [m for m in sys.modules if m.startswith(("agent_beside_cfg", "agent_pkg_beside"))]:
            del sys.modules[name]


def test_config_check_finds_an_agent_beside_the_config_from_another_directory(tmp_path):
    (tmp_path / "my_agent.py").write_text(AGENT)
    path = _config(tmp_path / "agent.yaml", name="openai_agent", params={"agent": "my_agent:run"})
    r = subprocess.run([sys.executable, "-m", "astraflow", "config", "check", path], capture_output=True, text=True,
                       timeout=120, cwd="/", stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1].endswith("agent.yaml: valid")
