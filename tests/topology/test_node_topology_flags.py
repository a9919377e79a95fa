"""``astraflow node --topology F --host H``: what it refuses, before starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.cli import main
from astraflow.errors import EXIT_FATAL

from .test_topology_files import changed, write

JOB = str(Path(__file__).resolve().parents[2] / "examples" / "arithmetic_grpo.yaml")


def last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("flags, words", [
    (["--topology", "{t}"], "--topology and --host go together"),
    (["--host", "us-0"], "--topology and --host go together"),
    (["--topology", "{t}", "--host", "us-0", "--role", "raas"], "--role places one node"),
    (["--topology", "{t}", "--host", "us-0", "--nnodes", "2"], "--nnodes places one node"),
    (["--topology", "{t}", "--host", "mars"], "--host: unknown host 'mars' (hosts: us-0, us-1, eu-0)"),
    ([], "--role is required (or --topology FILE --host NAME"),
])
def test_flag_errors(tmp_path, capsys, flags, words):
    t = str(write(tmp_path, changed(lambda d: d["regions"]["eu"]["pools"]["slow"].update(hosts=["eu-0"]))))
    assert main(["node", "--config", JOB, *[f.format(t=t) for f in flags]]) == EXIT_FATAL
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
