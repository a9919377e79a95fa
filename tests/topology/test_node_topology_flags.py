"""``astraflow node --topology F --host H``: what it refuses, before starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.cli import main
from astraflow.cli.args import EXIT_USAGE
from astraflow.errors import EXIT_FATAL

from .test_topology_files import changed, write

JOB = str(Path(__file__).resolve().parents[2] / "examples" / "arithmetic_grpo.yaml")


def last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("flags, words, code", [
    (["--topology", "{t}"], "--topology and --host go together", EXIT_USAGE),
    (["--host", "us-0"], "--topology and --host go together", EXIT_USAGE),
    (["--topology", "{t}", "--host", "us-0", "--role", "raas"], "--role places one node", EXIT_USAGE),
    (["--topology", "{t}", "--host", "us-0", "--nnodes", "2"], "--nnodes places one node", EXIT_USAGE),
    # the flags are well formed; the topology file has no such host: an input error, as a bad key is
    (["--topology", "{t}", "--host", "mars"], "--host: unknown host 'mars' (hosts: us-0, us-1, eu-0)", EXIT_FATAL),
    ([], "--role is required (or --topology FILE --host NAME", EXIT_USAGE),
])
def test_flag_errors(tmp_path, capsys, flags, words, code):
    t = str(write(tmp_path, changed(lambda d: d["regions"]["eu"]["pools"]["slow"].update(hosts=["eu-0"]))))
    assert main(["node", "--config", JOB, *[f.format(t=t) for f in flags]]) == code
    assert words in last_error(capsys)


def test_an_embedded_cluster_needs_servers_on_a_real_host(tmp_path, capsys):
    t = str(write(tmp_path, changed(lambda d: d["autoscaler"].update(enabled=False))))
    assert main(["node", "--config", JOB, "--topology", t, "--host", "us-1"]) == EXIT_FATAL
    assert "regions.us.kafka: is 'embedded', which only `astraflow launch` starts" in last_error(capsys)


def test_the_local_backend_cannot_reach_another_host(tmp_path, capsys):
    # BASE: the autoscaler lives with the trainer on us-0; elastic pools sit on us-1 and eu-0
    t = str(write(tmp_path, changed(lambda d: d["regions"]["us"].update(kafka="k:9092"))))
    assert main(["node", "--config", JOB, "--topology", t, "--host", "us-0"]) == EXIT_FATAL
    err = last_error(capsys)
    assert "regions.us.pools.fast.hosts: elastic pool fast is on host us-1" in err and "backend: command" in err


def _hosts_topology(tmp_path) -> str:
    """BASE on an existing cluster, elastic pools off: the two-host case reaches the key check."""
    def edit(d):
        d["regions"]["us"]["kafka"] = "k:9092"
        d["autoscaler"]["enabled"] = False
    return str(write(tmp_path, changed(edit)))


def test_several_hosts_refuse_key_pairs_each_host_would_make_up(tmp_path, capsys):
    """Each host's run dir would make up its own signing pair, and the readers on the other hosts
    would dead-letter all it signs (a job that never trains): refused before anything starts,
    naming the job file, the key and what to do."""
    assert main(["node", "--config", JOB, "--topology", _hosts_topology(tmp_path), "--host", "eu-0",
                 "--run-dir", str(tmp_path / "run")]) == EXIT_FATAL
    err = last_error(capsys)
    assert f"{JOB}: trainer.signing_key: this topology runs on 3 hosts (eu-0, us-0, us-1)" in err, err
    assert "rollout.signing_key" in err and "openssl genpkey -algorithm ed25519" in err and "verify_key" in err, err
    assert not (tmp_path / "run" / "keys").exists()  # nothing made up, nothing started


def test_several_hosts_start_once_the_pairs_are_configured_or_signatures_are_off(tmp_path):
    from astraflow.actors.signing import unkeyed
    from astraflow.config import load_config
    from astraflow.topology.launch import check_keys_on_hosts, load_plan
    from astraflow.weights.signing import ensure_key_pair
    for name in ("trainer", "raas"):
        ensure_key_pair(tmp_path / f"{name}.pem", tmp_path / f"{name}.pub")
    topology = _hosts_topology(tmp_path)
    bare = load_config(JOB, {})
    assert unkeyed(bare) == ["trainer.signing_key", "rollout.signing_key"]
    # a RaaS host: the trainer's public key only, its pool's pair
    remote = load_config(JOB, {"trainer.verify_key": str(tmp_path / "trainer.pub"),
                               "rollout.signing_key": str(tmp_path / "raas.pem")})
    assert unkeyed(remote) == []
    check_keys_on_hosts(load_plan(topology, remote), remote)
    off = load_config(JOB, {"trainer.require_signatures": False, "rollout.require_signatures": False})
    check_keys_on_hosts(load_plan(topology, off), off)
    # one host: its run dir is every component's, the made-up pairs are shared
    one = str(write(tmp_path, {"name": "one", "regions": {"us": {"kafka": "k:9092", "hosts": ["us-0"], "pools": {
        "dataflow": {"component": "dataflow", "hosts": ["us-0"]}, "trainer": {"component": "trainer", "hosts": ["us-0"]},
        "raas": {"component": "raas", "hosts": ["us-0"], "count": 1}}}}}, name="one.yaml"))
    check_keys_on_hosts(load_plan(one, bare), bare)
