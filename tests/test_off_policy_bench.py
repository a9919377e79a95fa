"""The off-policy benchmark end to end at smoke size (the tiny model, 2 steps): a bf16 rollout
engine makes a real gap that an fp32 one does not, each arm trains with its correction, and
the JSON has one entry per arm with the gap metrics and the accuracies."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_quick_run_measures_the_gap_per_arm(tmp_path, dtype):
    from astraflow.benchmarks import off_policy

    out = tmp_path / "off_policy.json"
    assert off_policy.main(["--quick", "--dtype", dtype, "--arms", "none", "icepop", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert list(data["arms"]) == ["none", "icepop"] and data["rollout_dtype"] == dtype
    assert data["arms"]["icepop"]["correction"] == {"method": "icepop", "lo": 0.5, "hi": 5.0}
    for arm in data["arms"].values():
        (run,) = arm["runs"]
        assert run["steps"] == 2 and 0 <= run["accuracy_final"] <= 1 and run["problems"] == 16
        gap = arm["summary"]["behav_logp_gap"]["median"]
        if dtype == "bf16":
            assert gap > 1e-3  # bfloat16 weights and forward against the fp32 trainer
        else:
            assert gap < 1e-4
    assert data["arms"]["icepop"]["runs"][0]["correction_masked_frac"] is not None
    assert data["arms"]["none"]["runs"][0]["correction_masked_frac"] is None
