"""The checkpoint store: a process SIGKILLed inside a save leaves the previous checkpoint in force."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from astraflow.engines.checkpoints import PAUSE_ENV, CheckpointError, CheckpointStore

# A writer with the shape of a trainer's: the engine's files, then the caller's state.
WRITER = textwrap.dedent("""
    import sys, torch
    from astraflow.engines.checkpoints import CheckpointStore
    store = CheckpointStore(sys.argv[1], keep=2)
    for step in map(int, sys.argv[2:]):
        store.save(step, lambda d: torch.save({"w": torch.full((64, 64), float(step))}, d / "model.pt"),
                   {"step": step, "lineage": list(range(step))})
""")


def _run_writer(root, *steps: int, pause: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, PAUSE_ENV: str(pause)} if pause else {k: v for k, v in os.environ.items() if k != PAUSE_ENV}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root), *map(str, steps)], env=env)


def _load(ckpt) -> float:
    return float(torch.load(ckpt.path / "model.pt")["w"][0, 0])


def test_sigkill_inside_a_save_leaves_the_previous_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    assert _run_writer(root, 1, 2).wait(120) == 0
    for attempt in range(2):  # killed twice in a row inside the save of step 3
        proc = _run_writer(root, 3, pause=60)
        partial = root / "step_00000003.partial"
        deadline = time.monotonic() + 120
        while not (partial / "model.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the writer never reached the save"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        latest = CheckpointStore(root).latest()
        assert (latest.step, latest.state["lineage"], _load(latest)) == (2, [0, 1], 2.0), attempt
        assert json.loads((root / "LATEST").read_text()) == {"step": 2, "dir": "step_00000002"}

    # The next save replaces the leftover, publishes step 3 and keeps the newest two.
    assert _run_writer(root, 3, 4).wait(120) == 0
    latest = CheckpointStore(root).latest()
    assert (latest.step, _load(latest)) == (4, 4.0)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_00000003", "step_00000004"]


def test_bad_pointers_and_old_steps_are_refused_with_the_path(tmp_path):
    store = CheckpointStore(tmp_path, keep=1)
    assert store.latest() is None
    store.save(5, lambda d: (d / "x").write_text("x"), {"step": 5})
    with pytest.raises(CheckpointError, match="checkpoint 5 is not newer than the published checkpoint 5"):
        store.save(5, lambda d: None, {})
    (tmp_path / "step_00000005" / "state.json").unlink()
    with pytest.raises(CheckpointError, match=f"{tmp_path}/LATEST names no readable checkpoint"):
        store.latest()
    with pytest.raises(ValueError, match="keep must be >= 1"):
        CheckpointStore(tmp_path, keep=0)


def test_keep_checkpoints_is_validated_at_load_time(tmp_path):
    from astraflow.config import ConfigError, load_config

    path = tmp_path / "job.yaml"
    path.write_text("job: j\ntrainer:\n  keep_checkpoints: 0\n")
    with pytest.raises(ConfigError, match=r"job.yaml: trainer.keep_checkpoints: must be in \[1, 10000\], got 0"):
        load_config(path)
    path.write_text("job: j\n")
    assert load_config(path).trainer.keep_checkpoints == 2
