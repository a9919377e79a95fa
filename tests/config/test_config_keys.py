"""`astraflow config keys` is the reference a user reads: every key says what it does and
shows its real default."""

from __future__ import annotations

from astraflow.cli.config import describe
from astraflow.config import JobConfig


def test_every_key_has_help_and_a_default():
    rows = describe(JobConfig)
    keys = {k for k, _, _ in rows}
    assert {"trainer.engine.ppo_epochs", "trainer.engine.kl_in_reward_coef", "kafka.transaction_timeout_ms",
            "data.on_bad_row", "trainer.keep_checkpoints"} <= keys
    missing_help = [k for k, _, h in rows if not h]
    assert not missing_help, missing_help
    assert dict((k, d) for k, d, _ in rows)["trainer.engine.loss_params"] == "{}"  # a factory default, not "(required)"
    assert [k for k, d, _ in rows if d == "'(required)'"] == ["job"]
    helps = {k: h for k, _, h in rows}
    assert helps["dataflow.groups_per_batch"].endswith("(in [1, 100000])")
    assert helps["rollout.temperature"].endswith("(in (0, 100])")
