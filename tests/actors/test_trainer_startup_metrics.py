"""A (re)started trainer reports where its start-up went (``trainer.start.<phase>_s``), which
``benchmarks/trainer_loss.py`` reads to break a restart down; the trainer actor runs its real
setup on the tiny model against the real broker."""

from __future__ import annotations

import pytest

from astraflow.actors.trainer import TrainerActor
from astraflow.topics import Metric
from astraflow.topics.replay import read_topic

from .conftest import signed_job


def test_the_trainer_reports_each_phase_of_its_start(bootstrap, tmp_path):
    cfg = signed_job(bootstrap, tmp_path, "startup", {"trainer": {"steps": 2, "engine": {"threads": 1}}})
    actor = TrainerActor(None, "trainer", cfg, bootstrap, str(tmp_path / "run"))
    try:
        actor.setup()
        actor.producer.flush()
    finally:
        actor.teardown()
    got = {m.name.removeprefix("trainer.start."): m.value for _, _, m in read_topic(bootstrap, actor.topics.metrics)
           if isinstance(m, Metric) and m.name.startswith("trainer.start.")}
    phases = {"python_s", "torch_import_s", "engine_imports_s", "engine_process_group_s", "engine_model_load_s",
              "engine_deepspeed_initialize_s", "engine_other_s", "checkpoint_load_s", "clients_s", "publisher_s"}
    assert set(got) == phases | {"total_s"}, sorted(got)
    assert min(got.values()) >= 0
    # this process started long before the setup (pytest, the broker): python_s is its age then
    assert got["total_s"] == pytest.approx(sum(got[p] for p in phases), abs=0.05)
    assert got["engine_model_load_s"] > 0 and got["python_s"] > 0
