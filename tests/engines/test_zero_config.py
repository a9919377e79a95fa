"""DeepSpeed's ZeRO bucket and live-parameter sizes are trainer config keys: they reach the
engine DeepSpeed builds (its parsed config and the ZeRO optimizer itself), and a bad value
is an error naming the key, from Python and from a job file."""

from __future__ import annotations

import pytest

from astraflow.engines.config import ZERO_SIZE_KEYS, TrainerConfig

#: distinct from each other and from every default, so each must have come from the config
SIZES = {"reduce_bucket_size": 3_000_001, "allgather_bucket_size": 3_000_002, "stage3_prefetch_bucket_size": 3_000_003,
         "stage3_param_persistence_threshold": 3_004, "stage3_max_live_parameters": 3_000_005,
         "stage3_max_reuse_distance": 3_000_006, "sub_group_size": 3_000_007}


def test_defaults_are_cpu_sized_and_every_key_is_documented():
    import dataclasses

    cfg = TrainerConfig()
    fields = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    assert set(SIZES) == set(ZERO_SIZE_KEYS)
    for key in ZERO_SIZE_KEYS:
        # DeepSpeed's own buckets are 5e8 elements (2 GB of fp32) and it keeps 1e9 live parameters.
        assert 0 < getattr(cfg, key) <= 100_000_000, key
        assert fields[key].metadata["help"], key


def test_zero_optimization_section_carries_every_size():
    from astraflow.engines.deepspeed_trainer import zero_optimization

    assert zero_optimization(TrainerConfig(zero_stage=3, **SIZES)) == {"stage": 3, **SIZES}


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_sizes_reach_the_deepspeed_engine(tiny_model_path, zero_stage):
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    trainer = DeepSpeedTrainer(tiny_model_path, TrainerConfig(zero_stage=zero_stage, threads=1, **SIZES))
    engine = trainer.engine
    parsed = {"reduce_bucket_size": engine.zero_reduce_bucket_size(),
              "allgather_bucket_size": engine.zero_allgather_bucket_size(),
              "stage3_prefetch_bucket_size": engine.zero_prefetch_bucket_size(),
              "stage3_param_persistence_threshold": engine.zero_param_persistence_threshold(),
              "stage3_max_live_parameters": engine.zero_max_live_parameters(),
              "stage3_max_reuse_distance": engine.zero_max_reuse_distance(),
              "sub_group_size": engine.zero_sub_group_size()}
    assert parsed == SIZES
    # ... and the ZeRO optimizer DeepSpeed built runs with them.
    assert engine.optimizer.reduce_bucket_size == SIZES["reduce_bucket_size"]
    if zero_stage == 3:
        assert engine.optimizer.sub_group_size == SIZES["sub_group_size"]
        assert engine.optimizer.prefetch_elements == SIZES["stage3_prefetch_bucket_size"]
    else:
        assert engine.optimizer.allgather_bucket_size == SIZES["allgather_bucket_size"]
    trainer.close()


@pytest.mark.parametrize("key,value", [("reduce_bucket_size", 0), ("stage3_max_live_parameters", -1),
                                       ("sub_group_size", 1e7), ("allgather_bucket_size", True),
                                       ("stage3_prefetch_bucket_size", "1e7")])
def test_a_bad_size_names_its_key(key, value):
    with pytest.raises(ValueError, match=rf"trainer\.{key} must be a whole number of elements"):
        TrainerConfig(**{key: value})


def test_a_bad_size_in_a_job_file_names_the_dotted_key():
    from pathlib import Path

    from astraflow.config import load_config
    from astraflow.typed_config import ConfigError

    example = Path(__file__).resolve().parents[2] / "examples" / "arithmetic_grpo.yaml"
    ok = load_config(example, {"trainer.engine.stage3_max_live_parameters": 20_000_000})
    assert ok.trainer.engine.stage3_max_live_parameters == 20_000_000
    # YAML reads 1e7 as the string '1e7'.
    with pytest.raises(ConfigError, match=r"trainer\.engine\.stage3_max_live_parameters: expected int, got str"):
        load_config(example, {"trainer.engine.stage3_max_live_parameters": "1e7"})
    with pytest.raises(ConfigError, match=r"trainer\.engine\.reduce_bucket_size: must be in \[1, 1000000000000\]"):
        load_config(example, {"trainer.engine.reduce_bucket_size": 0})


def test_a_zero3_checkpoint_split_into_other_sub_groups_names_the_size_to_set(tiny_model_path, tmp_path):
    """ZeRO-3 keeps its optimizer state per sub-group, so a checkpoint resumes only under the
    ``sub_group_size`` that split it; another one is a fatal error naming the value to set
    (DeepSpeed's own is torch's bare 'parameter group that doesn't match'), and that value
    resumes it exactly."""
    import json

    from astraflow.engines.base import TrainBatch, TrainSample
    from astraflow.engines.deepspeed_checkpoint import WORLD_FILE, CheckpointLayoutError
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer
    from astraflow.errors import FatalError

    def trainer(sub_group_size):
        return DeepSpeedTrainer(tiny_model_path, TrainerConfig(zero_stage=3, threads=1, lr=1e-3,
                                                               sub_group_size=sub_group_size))

    batch = TrainBatch(tuple(TrainSample((5, 6, 7), (8, 9), (-1.0, -1.0), reward=float(i % 2), group_id=0)
                             for i in range(4)))
    saved = trainer(1_000_000_000)  # one sub-group (what checkpoints before the key used)
    saved.train_step(batch)
    saved.save_checkpoint(tmp_path / "ckpt", {"offset": 7})
    assert json.loads((tmp_path / "ckpt" / WORLD_FILE).read_text())["sub_group_size"] == 1_000_000_000
    with pytest.raises(CheckpointLayoutError, match=r"set trainer\.engine\.sub_group_size: 1000000000") as err:
        trainer(100_000).load_checkpoint(tmp_path / "ckpt")  # many sub-groups
    assert isinstance(err.value, FatalError)
    resumed = trainer(1_000_000_000)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"offset": 7} and resumed.step == 1
    assert resumed.train_step(batch)["loss"] == pytest.approx(saved.train_step(batch)["loss"], abs=1e-6)
