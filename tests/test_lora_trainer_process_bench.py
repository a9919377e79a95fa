"""benchmarks/lora_trainer_process.py: what the memory saved is computed from, and how its table
renders (on hand-made figures; the runs are the benchmark)."""

from __future__ import annotations

from astraflow.benchmarks import lora, lora_trainer_process as ltp


def _rep(one: tuple[float, float, float], two: tuple[float, float, float]) -> dict:
    return {arm: dict(zip(ltp.FIGURES, v)) for arm, v in (("one_process", one), ("two_processes", two))}


def test_saved_memory_is_two_processes_minus_one_per_repetition_then_spread():
    reps = [_rep((900, 1500, 1000), (1500, 2600, 1700)), _rep((950, 1400, 1000), (1500, 2500, 1600)),
            _rep((900, 1600, 1100), (1400, 2700, 1650))]
    rows = ltp.aggregate(reps)
    saved = rows["saved_mb"]
    assert saved["built_mb"]["runs"] == [600, 550, 500] and saved["built_mb"]["median"] == 550
    assert saved["peak_rss_mb"]["runs"] == [1100, 1100, 1100]
    assert saved["rss_after_train_mb"]["min"] == 550 and saved["rss_after_train_mb"]["max"] == 700
    assert rows["one_process"]["peak_rss_mb"]["median"] == 1500


def test_the_section_renders_under_the_lora_table():
    reps = [_rep((900, 1500, 1000), (1500, 2600, 1700))] * 3
    section = {"rank": 8, "steps": 2, "rows": ltp.aggregate(reps)}
    lines = lora.trainer_process_rows(section)
    assert lines[0].startswith("Two LoRA policies' trainers (rank 8)") and "3 repetitions" in lines[0]
    assert "| one process (base shared) | 900 (900–900) | 1,500 (1,500–1,500) | 1,000 (1,000–1,000) |" in lines
    assert "| saved by one process | 600 (600–600) | 1,100 (1,100–1,100) | 700 (700–700) |" in lines
    assert lora.trainer_process_rows(None) == []
