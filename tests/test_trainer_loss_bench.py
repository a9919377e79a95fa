"""``benchmarks/trainer_loss.py``'s analysis, on a small recorded run: the time from each trainer
SIGKILL to the restarted trainer's first step, and a breakdown that adds up to it."""

from __future__ import annotations

import json

import pytest

from astraflow.benchmarks import trainer_loss


def _row(ts, name, value, step, component="trainer.policy"):
    return {"ts": ts, "component": component, "name": name, "value": value, "step": step}


def _recorded() -> tuple[list[dict], list[dict]]:
    """Steps 1-7 at t=1..7; a kill at 7.5 (head 7, checkpoint 5); the restart's start-up metrics at
    20.0 (it took 10.0 s from its process's start, at 10.0); steps 6, 7 again at 21, 22, step 8 at 25;
    a second kill at 30.0 whose restart never stepped. Another component's rows are ignored."""
    rows = [_row(float(s), "trainer.samples", 16.0, s) for s in range(1, 8)]
    rows.append(_row(7.2, "trainer.samples", 16.0, 99, component="raas.raas-0"))
    startup = {"python": 2.0, "torch_import": 1.0, "engine_imports": 3.0, "engine_other": 0.25,
               "engine_process_group": 0.25, "engine_model_load": 0.5, "engine_deepspeed_initialize": 1.5,
               "checkpoint_load": 0.5, "clients": 0.5, "publisher": 0.5, "total": 10.0}
    rows += [_row(20.0, f"trainer.start.{k}_s", v, 5) for k, v in startup.items()]
    rows += [_row(21.0, "trainer.samples", 16.0, 6), _row(22.0, "trainer.samples", 16.0, 7),
             _row(25.0, "trainer.samples", 16.0, 8)]
    faults = [{"kind": "sigkill", "target": "trainer", "started": 7.5},
              {"kind": "sigkill", "target": "raas-0", "started": 8.0},
              {"kind": "sigkill", "target": "trainer", "started": 30.0}]
    return rows, faults


def test_each_kill_is_measured_to_the_next_trained_step_and_the_breakdown_adds_up():
    rows, faults = _recorded()
    first, second = trainer_loss.analyse(rows, faults)
    assert first["killed_at_step"] == 7 and first["next_step"] == 6
    assert first["next_batch_after_kill_s"] == pytest.approx(13.5)
    assert first["new_step_after_kill_s"] == pytest.approx(17.5)  # step 8: past the pre-kill head
    b = first["breakdown_s"]
    assert list(b) == list(trainer_loss.BREAKDOWN)
    assert b["restart_wait"] == pytest.approx(2.5)  # process start at 10.0, killed at 7.5
    assert b["first_step"] == pytest.approx(1.0) and b["engine_imports"] == 3.0
    assert sum(b.values()) == pytest.approx(first["next_batch_after_kill_s"])
    assert first["unaccounted_s"] == pytest.approx(0.0)
    assert second["next_batch_after_kill_s"] is None and "breakdown_s" not in second


def test_the_result_is_a_spread_over_the_recovered_kills_and_renders(tmp_path):
    rows, faults = _recorded()
    kills = trainer_loss.analyse(rows, faults)
    agg = trainer_loss.aggregate(kills)
    assert agg["next_batch_after_kill_s"]["n"] == 1 and agg["next_batch_after_kill_s"]["median"] == pytest.approx(13.5)
    assert agg["kills_not_recovered"] == 1
    assert set(agg["breakdown_s"]) == set(trainer_loss.BREAKDOWN)
    d = {"quick": False, "method": {"restart_delay_s": 2.0}, **agg}
    text = "\n".join(trainer_loss.report_rows(lambda name: d if name == "trainer_loss" else None))
    assert "`next_batch_after_kill_s`" in text and "13.5 (13.5–13.5)" in text and "DeepSpeed and transformers imports" in text
    with pytest.raises(RuntimeError, match="no kill"):
        trainer_loss.aggregate(kills[1:])


def test_a_recorded_run_dir_is_read_back_with_collect(tmp_path, capsys):
    rows, faults = _recorded()
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = {"faults": faults, "audit": {"ok": True}, "samples_lost": 0, "duplicates_trained": 0, "ok": True}
    (tmp_path / "chaos_report.json").write_text(json.dumps(report))
    out = tmp_path / "trainer_loss.json"
    assert trainer_loss.main(["--collect", str(tmp_path), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["next_batch_after_kill_s"]["median"] == pytest.approx(13.5)
    assert data["audit"] == {"ok": True, "samples_lost": 0, "duplicates_trained": 0, "run_ok": True}
    assert "next trained step" in capsys.readouterr().out
