"""Which key signs and which key checks a policy's announcements, from the job config."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import yaml

from astraflow.actors.signing import (group_signer_for, group_verifier_for, run_key_paths, signer_for, trainer_keys,
                                      verifier_for, with_run_keys)
from astraflow.config import JobConfig, from_dict, load_config
from astraflow.typed_config import ConfigError
from astraflow.weights.signing import KeyFileError, SignatureError, ensure_key_pair, load_public_key


def _cfg(rollout: dict | None = None, **trainer) -> JobConfig:
    return from_dict(JobConfig, {"job": "keys", "trainer": trainer, "rollout": rollout or {}})


def test_a_run_without_keys_gets_its_own_pair_once_and_every_role_agrees_on_it(tmp_path):
    cfg = with_run_keys(_cfg(), tmp_path)
    private, public = run_key_paths(tmp_path, "policy")
    assert (cfg.trainer.signing_key, cfg.trainer.verify_key) == (str(private), str(public))
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    signer, verifier = trainer_keys(cfg)
    again = with_run_keys(_cfg(), tmp_path)  # a restarted node, or another role of the run
    assert verifier_for(again).key_id == signer.key_id == verifier.key_id
    ann = b'{"policy":"policy","version":1}'
    verifier.check("af.keys.versions", ann, signer.headers("af.keys.versions", ann))
    with pytest.raises(SignatureError, match="bad_signature"):  # the same bytes on another job's topic
        verifier.check("af.other.versions", ann, signer.headers("af.keys.versions", ann))


def test_every_policy_of_a_multi_policy_job_gets_its_own_key(tmp_path):
    cfg = from_dict(JobConfig, {"job": "team", "policies": {"solver": {}, "verifier": {}},
                                "workflow": {"name": "solver_verifier",
                                             "roles": {"solver": "solver", "verifier": "verifier"}}})
    keyed = with_run_keys(cfg, tmp_path)
    ids = {p: signer_for(keyed.view(p)).key_id for p in ("solver", "verifier")}
    assert ids["solver"] != ids["verifier"]
    assert {p: verifier_for(keyed.view(p)).key_id for p in ids} == ids
    view = with_run_keys(cfg.view("verifier"), tmp_path)  # what a verifier trainer node is started with
    assert signer_for(view).key_id == ids["verifier"]


def test_required_signatures_without_a_key_are_a_config_error_naming_the_key(tmp_path):
    cfg = _cfg()
    with pytest.raises(ConfigError, match=r"trainer\.signing_key: not set"):
        signer_for(cfg)
    with pytest.raises(ConfigError, match=r"trainer\.verify_key: not set"):
        verifier_for(cfg)
    lenient = _cfg(require_signatures=False)
    assert signer_for(lenient) is None and not verifier_for(lenient).checks
    with pytest.raises(ConfigError, match=r"rollout\.signing_key: not set"):
        group_signer_for(lenient)  # the pool's groups are still required to be signed
    with pytest.raises(ConfigError, match=r"rollout\.verify_key: not set"):
        group_verifier_for(lenient)
    opted_out = _cfg(rollout={"require_signatures": False}, require_signatures=False)
    assert group_signer_for(opted_out) is None and not group_verifier_for(opted_out).checks
    assert with_run_keys(opted_out, tmp_path / "run") is opted_out  # opted out: no key is made
    assert not (tmp_path / "run").exists()


def test_a_run_s_pool_gets_its_own_group_key_distinct_from_the_trainer_s(tmp_path):
    keyed = with_run_keys(_cfg(), tmp_path)
    private, public = run_key_paths(tmp_path, "raas-policy")
    assert (keyed.rollout.signing_key, keyed.rollout.verify_key) == (str(private), str(public))
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert group_signer_for(keyed).key_id == group_verifier_for(keyed).key_id != signer_for(keyed).key_id


def test_configured_keys_are_kept_relative_to_the_config_file_and_must_agree(tmp_path):
    keys = tmp_path / "keys"
    ensure_key_pair(keys / "a.pem", keys / "a.pub")
    ensure_key_pair(keys / "b.pem", keys / "b.pub")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"job": "k", "trainer": {"signing_key": "keys/a.pem", "verify_key": "keys/a.pub"},
                                    "rollout": {"signing_key": "keys/b.pem"}}))
    cfg = load_config(path)
    assert with_run_keys(cfg, tmp_path / "run") is cfg and not (tmp_path / "run").exists()
    signer, verifier = trainer_keys(cfg)
    assert signer.key_id == verifier.key_id == verifier_for(cfg).key_id
    assert group_signer_for(cfg).key_id == group_verifier_for(cfg).key_id != signer.key_id  # the pool's own key
    # A reader given only the public key; a trainer whose two keys disagree.
    assert verifier_for(load_config(path, {"trainer.signing_key": None})).key_id == signer.key_id
    with pytest.raises(ConfigError, match="readers would refuse every announcement"):
        trainer_keys(load_config(path, {"trainer.verify_key": "keys/b.pub"}))
    with pytest.raises(KeyFileError, match="cannot read the private key file"):
        signer_for(load_config(path, {"trainer.signing_key": "keys/missing.pem"}))
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        verifier_for(load_config(path, {"trainer.verify_key": "job.yaml"}))


def test_processes_starting_at_once_share_one_key(tmp_path):
    code = ("import sys; from astraflow.weights.signing import ensure_key_pair; "
            "ensure_key_pair(sys.argv[1], sys.argv[1] + '.pub')")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "k")], env=dict(os.environ))
             for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert load_public_key(tmp_path / "k") == load_public_key(tmp_path / "k.pub")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]  # no temp file left behind
