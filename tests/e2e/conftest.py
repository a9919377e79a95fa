"""End-to-end fixtures: small job configs that run real processes on the session broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

SMALL = {
    "rollout": {"n_samples": 4, "max_new_tokens": 6, "tasks_per_call": 4, "heartbeat_s": 1.0,
                "engine": {"kind": "cpu", "threads": 1}},
    "dataflow": {"groups_per_batch": 4, "max_staleness": 1},
    "trainer": {"steps": 4, "checkpoint_every": 1, "snapshot_every": 2,
                "engine": {"threads": 1}},
    "eval": {"every": 0, "problems": 40, "k": 2, "threads": 1},
}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


@pytest.fixture
def make_job_config(tmp_path):
    """Write a job config (the demo's, shrunk, plus ``extra``) and load it."""
    from astraflow.config import load_config

    def make(extra: dict | None = None, name: str = "job"):
        data = yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text())
        data = _merge(_merge(data, SMALL), extra or {})
        data["job"] = f"{name}-{uuid.uuid4().hex[:8]}"
        data["run_dir"] = str(tmp_path / "runs")
        path = tmp_path / f"{data['job']}.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_config(path)

    return make
