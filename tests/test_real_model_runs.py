"""``benchmarks/real_model_runs.py`` judges a run by its own summary: per-problem held-out rewards at
the first and last version, the rise paired over problems, in standard errors. The numbers
here are made up and known, so every figure it derives can be checked, and a run that lacks
the per-problem record is refused rather than read as no change."""

from __future__ import annotations

import json
import math
import statistics
import time

import pytest

from astraflow.benchmarks.real_model_runs import main, repetition
from astraflow.config import load_config
from astraflow.run_outputs import RunState, record, write_outputs
from astraflow.topics import Metric

V0 = [0, 1, 0, 0, 1, 0, 0, 1, 0, 0]  #: greedy pass/fail per held-out problem at v0 ...
V20 = [1, 1, 1, 0, 1, 0, 1, 1, 0, 1]  #: ... and at v20: five up, none down, five the same


def _write(tmp_path, versions: dict[int, list[int]]):
    state = RunState()
    for v, per in versions.items():
        record(state, Metric("eval.policy", "eval.accuracy", sum(per) / len(per), step=v, ts=time.time()))
        for i, r in enumerate(per):
            record(state, Metric("eval.policy", "eval.task_reward", float(r), step=v, ts=time.time(),
                                 labels={"task": i}))
    d = tmp_path / "run"
    d.mkdir()
    write_outputs(d, load_config("examples/smollm2_chat_arithmetic.yaml"), state, time.time() - 30.0, [], False,
                  None, extra={"audit": {"ok": True}})
    return d


def test_a_run_is_judged_paired_over_problems(tmp_path, capsys):
    r = repetition(_write(tmp_path, {0: V0, 20: V20}))
    change = [b - a for a, b in zip(V0, V20)]
    paired = statistics.stdev(change) / math.sqrt(10)
    assert r["versions"] == [0, 20] and r["problems"] == 10
    assert r["accuracy_v0"] == pytest.approx(0.3) and r["accuracy_final"] == pytest.approx(0.7)
    assert r["se_v0"] == pytest.approx(statistics.stdev(V0) / math.sqrt(10))
    assert r["rise"] == pytest.approx(0.4) and r["se_rise_paired"] == pytest.approx(paired)
    assert r["rise_se_paired"] == pytest.approx(0.4 / paired)
    assert r["problems_up_down_same"] == [4, 0, 6] and r["audit_ok"] is True and r["wall_s"] >= 30
    out = tmp_path / "r.json"
    assert main(["--collect", str(tmp_path / "run"), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["runs"][0]["rise_se_paired"] == pytest.approx(0.4 / paired) and "wall_s" in data["runs"][0]
    assert "rise/SE" in capsys.readouterr().out


def test_a_run_without_per_problem_rewards_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no per-problem held-out rewards at two versions"):
        repetition(_write(tmp_path, {0: V0}))
