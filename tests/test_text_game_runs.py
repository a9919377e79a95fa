"""An agent job's run dir records its held-out episodes' figures (standard errors, turns, tool
calls, each task's mean reward) in ``summary.json``, and ``benchmarks/text_game_runs.py`` reads
its repetitions from there: the rise in standard errors over episodes, over games, and over
games paired (the same games at both versions)."""

from __future__ import annotations

import json
import math
import statistics
import time

import pytest

from astraflow.benchmarks.text_game_runs import main, repetition
from astraflow.config import load_config
from astraflow.run_outputs import RunState, record, write_outputs
from astraflow.topics import Metric

#: per game, the mean of its 4 samples at v0 and v8: four games up, one down, one the same
V0 = [0.0, 0.25, 0.5, 0.5, 1.0, 0.25]
V8 = [0.5, 0.5, 0.75, 0.25, 1.0, 0.5]


def _metrics(state: RunState, v: int, per_game: list[float], se: float, turns: float, actions: float) -> None:
    acc = sum(per_game) / len(per_game)
    for name, value in (("eval.accuracy", acc), ("eval.stderr", se), ("eval.stderr_tasks", 2 * se),
                        ("eval.episodes", 4 * len(per_game)), ("eval.turns", turns), ("eval.actions", actions)):
        record(state, Metric("eval.policy", name, value, step=v, ts=time.time()))
    for i, r in enumerate(per_game):
        record(state, Metric("eval.policy", "eval.task_reward", r, step=v, ts=time.time(), labels={"task": i}))


@pytest.fixture
def run_dir(tmp_path):
    cfg = load_config("examples/text_game.yaml")
    state = RunState()
    _metrics(state, 0, V0, 0.05, 3.5, 2.5)
    _metrics(state, 8, V8, 0.04, 3.0, 2.25)
    d = tmp_path / "run"
    d.mkdir()
    write_outputs(d, cfg, state, time.time() - 12.0, [], False, None, extra={"audit": {"ok": True}})
    return d


def test_the_summary_records_the_held_out_episodes(run_dir):
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["eval_episodes_by_version"]["8"] == {"accuracy": pytest.approx(sum(V8) / 6), "stderr": 0.04,
                                                  "stderr_tasks": 0.08, "episodes": 24.0, "turns": 3.0,
                                                  "actions": 2.25}
    assert s["eval_task_reward_by_version"]["0"] == {str(i): r for i, r in enumerate(V0)}


def test_a_repetition_is_judged_over_episodes_games_and_paired_games(run_dir, tmp_path, capsys):
    r = repetition(run_dir)
    rise = (sum(V8) - sum(V0)) / 6
    assert r["versions"] == [0, 8] and r["rise"] == pytest.approx(rise) and r["games"] == 6
    assert r["z_episodes"] == pytest.approx(rise / math.hypot(0.05, 0.04))
    assert r["z_games"] == pytest.approx(rise / math.hypot(0.10, 0.08))
    paired = statistics.stdev([b - a for a, b in zip(V0, V8)]) / math.sqrt(6)
    assert r["stderr_rise_games_paired"] == pytest.approx(paired) and r["z_games_paired"] == pytest.approx(rise / paired)
    assert r["games_up_down_same"] == [4, 1, 1]
    assert r["turns"] == [3.5, 3.0] and r["tool_calls"] == [2.5, 2.25] and r["audit_ok"] is True

    out = tmp_path / "runs.json"
    assert main(["--collect", str(run_dir), str(run_dir), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["repetitions"]) == 2 and data["rise"]["mean"] == pytest.approx(rise)
    assert data["min_z"]["z_games_paired"] == pytest.approx(rise / paired)
    assert "z pair" in capsys.readouterr().out


def test_a_run_without_episode_figures_is_refused_with_its_path(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"accuracy_by_version": {"0": 0.5}}))
    with pytest.raises(ValueError, match="eval_episodes_by_version"):
        repetition(tmp_path)
