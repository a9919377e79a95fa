"""One trainer process for several LoRA policies of one base (``policies.<p>.trainer.process``):
which processes a job starts, and the configs refused at load time with one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from astraflow.config import ConfigError, load_config
from tests.config.test_shared_pool import _load as load_shared_pool_example

ROOT = Path(__file__).resolve().parents[2]


def _load(tmp_path, change=None):
    """examples/solver_verifier_lora_shared.yaml with the verifier trained in the solver's process."""
    def edit(data):
        data["policies"]["verifier"]["trainer"]["process"] = "solver"
        if change:
            change(data)
    return load_shared_pool_example(tmp_path, edit)


def test_one_trainer_process_trains_both_policies_and_the_other_starts_none(tmp_path):
    from astraflow.launcher import default_processes
    from astraflow.node import child_specs

    cfg = _load(tmp_path)
    assert cfg.trainer_process_of("verifier") == "solver" and cfg.trainer_policies("solver") == ("solver", "verifier")
    assert cfg.trainer_policies("verifier") == ()
    procs = {(p.role, p.node_id) for p in default_processes(cfg, tmp_path)}
    assert procs == {("dataflow", "dataflow"), ("trainer", "trainer-solver"), ("raas", "raas-solver-0")}
    specs = child_specs("trainer", cfg.view("solver"), "127.0.0.1:1", str(tmp_path), "trainer-solver")
    assert [s.name for s in specs] == ["trainer", "trainer.verifier"] and all(s.required for s in specs)


def test_a_trainer_node_started_for_a_policy_another_process_trains_is_refused(tmp_path, capsys):
    from astraflow.cli import main
    from astraflow.cli.args import EXIT_USAGE

    _load(tmp_path)
    code = main(["node", "--config", str(tmp_path / "job.yaml"), "--role", "trainer", "--policy", "verifier"])
    assert code == EXIT_USAGE
    assert "trains it in 'solver''s trainer process (policies.verifier.trainer.process): start --role trainer " \
           "--policy solver" in capsys.readouterr().err


@pytest.mark.parametrize("change, match", [
    (lambda d: d["policies"]["verifier"]["trainer"].update(process="critic"),
     r"policies.verifier.trainer.process: no policy 'critic' \(policies: solver, verifier\)"),
    (lambda d: (d["policies"]["verifier"]["rollout"].pop("pool"),
                d["policies"]["verifier"]["trainer"].update(engine={"lora": None})),
     r"policies.verifier.trainer.process: one trainer process holds LoRA adapters of one base, and 'verifier' is "
     r"full fine-tuning"),
    (lambda d: d["policies"]["verifier"]["trainer"].update(ranks=2),
     r"policies.verifier.trainer.process: one trainer process holds the base once, unsharded: 'verifier' has "
     r"trainer.ranks 2"),
    (lambda d: d["policies"]["solver"].setdefault("trainer", {}).setdefault("engine", {}).update(zero_stage=3),
     r"policies.verifier.trainer.process: .* 'solver' has trainer.ranks 1 and zero_stage 3"),
    (lambda d: (d["policies"]["verifier"]["rollout"].pop("pool"), d["policies"]["verifier"].update(
        model={"task": "verifier"})),
     r"policies.verifier.trainer.process: one trainer process holds adapters of one base model, and 'verifier' "
     r"is on the tiny verifier model"),
    (lambda d: d["policies"]["solver"].setdefault("trainer", {}).update(process="verifier"),
     r"policies.(solver|verifier).trainer.process: '(solver|verifier)' is itself trained in"),
])
def test_a_shared_trainer_of_policies_that_cannot_share_a_base_is_refused(tmp_path, change, match):
    with pytest.raises(ConfigError, match=match) as e:
        _load(tmp_path, change)
    assert "\n" not in str(e.value)


def test_a_single_policy_job_names_no_trainer_process(tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text())
    data.setdefault("trainer", {})["process"] = "policy"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_config(path).trainer_policies("policy") == ("policy",)  # its own: nothing to refuse
    data["trainer"]["process"] = "other"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"trainer.process: names trainer process 'other', and a single-policy job"):
        load_config(path)
