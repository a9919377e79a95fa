"""The shipped code-workflow examples: each loads and passes `astraflow config check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.cli import main
from astraflow.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"code_solver_selector": ("selector", "code_solver_selector"),
            "code_solver_testgen": ("test_generator", "code_solver_testgen")}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_code_example_loads_and_passes_config_check(name, capsys):
    path = ROOT / "examples" / f"{name}.yaml"
    cfg = load_config(path)
    partner, workflow = EXAMPLES[name]
    assert cfg.workflow.name == workflow and cfg.data.source == "code"
    assert list(cfg.policy_names) == ["solver", partner] and cfg.lead_policy == "solver"
    # each role starts from its own warm start
    assert cfg.view("solver").model.task == "code_solver" and cfg.view(partner).model.task == partner
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().err.strip().endswith(f"{path}: valid")
