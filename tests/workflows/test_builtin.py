"""The shipped workflows register at the first lookup, and one whose dependency is missing
fails config load naming that dependency (never as an "unknown workflow" later)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A shipped module (the text game) that imports a package this machine lacks, planted ahead
# of every other finder; then a job config that runs a different workflow is loaded.
SCRIPT = """
import importlib.abc, importlib.util, sys

class Planted(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "astraflow.workflows.text_game":
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import astraflow_missing_dependency  # noqa: F401

sys.meta_path.insert(0, Planted())
from astraflow.config import load_config
import astraflow.workflows.api  # importing the API alone loads no shipped workflow
assert "astraflow.workflows.builtin" not in sys.modules
load_config(sys.argv[1])
"""


def test_a_missing_dependency_of_a_shipped_workflow_fails_config_load_naming_it(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "examples" / "arithmetic_grpo.yaml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert "ModuleNotFoundError: No module named 'astraflow_missing_dependency'" in proc.stderr, proc.stderr[-2000:]
    assert "unknown workflow" not in proc.stderr


def test_the_lookups_of_the_api_see_every_shipped_workflow_reward_and_environment():
    from astraflow.workflows.api import get_environment, get_reward, get_workflow

    for name in ("rlvr", "solver_verifier", "agent"):
        assert get_workflow(name).name == name
    assert get_reward("exact_match") and get_reward("math_answer")
    for env in ("text_game", "search", "http", "openenv"):
        assert callable(get_environment(env))
