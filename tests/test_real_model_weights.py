"""``benchmarks/real_model_weights.py``'s retention check reads what the broker holds, and
fails for a publisher that does not trim; its report renders a full result."""

from __future__ import annotations

import torch

from astraflow.benchmarks import real_model_weights as rmw


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(512, 512, generator=g).to(torch.bfloat16) for i in range(3)}


def test_the_retention_check_holds_for_the_trim_rule_and_fails_without_a_trim(bootstrap):
    v0, v1 = _weights(0), _weights(1)
    kept = rmw.retention(bootstrap, v0, v1, threads=1)
    assert kept["payloads"] == ["snapshot v0", "delta v1", "delta v2", "snapshot v2", "delta v3", "delta v4",
                                "snapshot v4"]
    assert kept["holds"] and kept["records_retained"] == kept["records_rule"] < kept["records_written"]
    untrimmed = rmw.retention(bootstrap, v0, v1, threads=1, trim=False)
    assert not untrimmed["holds"] and untrimmed["records_retained"] == untrimmed["records_written"]


def test_the_report_renders_every_row_and_the_transfer():
    s = {"median": 0.04, "min": 0.03, "max": 0.05, "n": 3, "runs": [0.03, 0.04, 0.05]}
    b = {"median": 8e6, "min": 7e6, "max": 9e6, "n": 3, "runs": [7e6, 8e6, 9e6]}
    x = {"repeats": 3, "full_bytes": 3.35e8, "full_s": s, "snapshot_e2e_MBps": s, "delta_s": s,
         "tools": {"consume": {"MBps": s}, "snapshot_vs_in_series": s}}
    d = {"config": "examples/smollm2_chat_arithmetic.yaml", "steps": 3, "repeats": 3,
         "rows": [{"lr": lr, "delta_over_snapshot": s, "delta_bytes": b, "changed_fraction": s, "meets_goal": lr < 2e-5}
                  for lr in (1e-6, 5e-6, 2e-5)],
         "transfer": {"fp32": x, "bf16": x, "rss_peak_gb_by_phase": {"fp32 rounds": 3.2},
                      "retention": {"versions": 5, "snapshot_every": 2, "records_written": 9, "bytes_written": 9e6,
                                    "records_retained": 4, "records_rule": 4, "holds": True}}}
    text = "\n".join(rmw.report_rows(lambda name: d if name == "real_model_weights" else None))
    for lr in ("| 1e-06 |", "| 5e-06 |", "| 2e-05 |"):
        assert lr in text
    assert "| fp32 | 335 |" in text and "| bf16 |" in text and "holds" in text and "fp32 rounds 3.20 GB" in text
    assert rmw.report_rows(lambda name: {**d, "quick": True}) == []
