"""benchmarks/trainer_scaling.py: a quick run launches real DeepSpeed ranks through torch's
launcher and writes the rows the results table of docs/benchmarks.md is rendered from."""

from __future__ import annotations

import json

import pytest

from astraflow.benchmarks import report, trainer_scaling


def test_batch_is_the_same_for_every_config():
    assert trainer_scaling.make_batch() == trainer_scaling.make_batch()
    assert len({s.reward for s in trainer_scaling.make_batch().samples}) == 2


def test_bad_stage_is_named(capsys):
    with pytest.raises(SystemExit):
        trainer_scaling.main(["--quick", "--zero", "4"])
    assert "--zero takes stages 0-3" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_two_ranks_zero3_agree_and_report(tmp_path):
    out = tmp_path / "results" / "trainer_scaling.json"
    rc = trainer_scaling.main(["--quick", "--ranks", "2", "--zero", "3", "--check",
                               "--model-root", str(tmp_path / "models"), "--out", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    (row,) = d["rows"]
    assert (row["ranks"], row["zero_stage"]) == (2, 3)
    # --check: finite losses, the step moved the weights, and both ranks hold the same ones.
    assert row["ranks_agree"] is True
    assert len(row["peak_rss_mb_per_rank"]) == 2 and row["peak_rss_mb"] > 0
    assert row["samples_per_s_min"] <= row["samples_per_s"] <= row["samples_per_s_max"]
    assert d["settings"]["timed_steps"] == 1 and d["model"]["parameters"] > 0
    assert d["settings"]["zero_sizes"] == "trainer" and d["settings"]["zero_optimization"]["sub_group_size"] > 0
    table = "\n".join(trainer_scaling.report_rows(lambda name: json.loads(out.with_stem(name).read_text())))
    assert "| 2 | 3 |" in table and "Trainer scaling" in table


def test_committed_results_cover_1_and_2_ranks_at_every_stage():
    """The docs/benchmarks.md table is rendered from this file: the issue's fields, all 8 configs, the
    full model (not --quick), the load it was measured under."""
    d = json.loads((report.RES / "trainer_scaling.json").read_text())
    assert not d["settings"]["quick"] and d["settings"]["timed_steps"] >= 3 and d["model"]["parameters"] > 100e6
    assert {(r["ranks"], r["zero_stage"]) for r in d["rows"]} == {(n, z) for n in (1, 2) for z in range(4)}
    for r in d["rows"]:
        assert r["samples_per_s_min"] <= r["samples_per_s"] <= r["samples_per_s_max"] and r["peak_rss_mb"] > 0
        assert len(r["peak_rss_mb_per_rank"]) == r["ranks"] and "loadavg" in r["load_before"]
    assert "loadavg" in d["load"]["before"]
    # Issue 27: with the trainer's CPU-sized ZeRO buckets and live parameters (not DeepSpeed's
    # GPU-sized defaults), ZeRO-3 on 2 ranks peaks below ZeRO-0 on 1 rank, per rank.
    peak = {(r["ranks"], r["zero_stage"]): max(r["peak_rss_mb_per_rank"]) for r in d["rows"]}
    assert d["settings"]["zero_sizes"] == "trainer" and peak[(2, 3)] < peak[(1, 0)]
    assert "the trainer's ZeRO sizes" in "\n".join(trainer_scaling.report_rows(report.load))
