"""A multi-host deployment end to end, every part a real process: three hosts started by
`astraflow node --topology F --host H` and the regional mirror by `astraflow mirror`, nothing
else (no `astraflow launch`). Home (us-east: dataflow, trainer, one RaaS node) is the session
broker; eu-west and eu-north share one existing regional cluster (the module's second broker,
``kafka: region:eu-west``), filled by the one MirrorMaker 2 that `astraflow mirror --region
eu-north` runs for it. What must hold: every process exits 0 on its own once the trainer is done;
the conservation audit of the job holds; both remote RaaS nodes loaded every version from the
regional cluster and the home node from home; each weight record is on the regional cluster
once."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from astraflow.chaos.invariants import audit_job
from astraflow.config import load_config
from astraflow.topics import JobTopics, Metric, ensure_topics, job_topics
from astraflow.topics.mirror_plan import weight_topics
from astraflow.topics.replay import read_topic
from astraflow.weights.signing import ensure_key_pair

from tests.e2e.conftest import SMALL, _merge

from .test_existing_regional_clusters import region_cluster  # noqa: F401 - the module's second real cluster
from .test_shared_regional_cluster import _records

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "examples" / "topology_three_regions_shared.yaml"
JOB = ROOT / "examples" / "arithmetic_grpo.yaml"
STEPS = SMALL["trainer"]["steps"]  # the demo job shrunk as tests/e2e's jobs are
HOSTS = ("us-0", "eu-0", "no-0")


def _job_files(tmp_path: Path) -> dict[str, Path]:
    """The job's config as each host holds it: the same job, and only the keys the host needs.
    The trainer's private key is on us-0 alone; every RaaS host holds its pool's pair (it signs
    trajectory groups), the others the public halves (docs/security.md)."""
    keys = tmp_path / "keys"
    for name in ("trainer", "raas"):
        ensure_key_pair(keys / f"{name}.pem", keys / f"{name}.pub")
    job = f"mh-{uuid.uuid4().hex[:8]}"
    pool = {"signing_key": str(keys / "raas.pem"), "verify_key": str(keys / "raas.pub")}
    held = {"us-0": {"trainer": {"signing_key": str(keys / "trainer.pem"), "verify_key": str(keys / "trainer.pub")},
                     "rollout": pool},
            "remote": {"trainer": {"verify_key": str(keys / "trainer.pub")}, "rollout": pool}}
    out = {}
    for host, extra in held.items():
        data = _merge(_merge(yaml.safe_load(JOB.read_text()), SMALL), extra)
        data["job"], data["run_dir"] = job, str(tmp_path / "runs")
        out[host] = tmp_path / f"job-{host}.yaml"
        out[host].write_text(yaml.safe_dump(data))
    return out


def _topology_file(tmp_path: Path, home: str, region: str) -> Path:
    data = yaml.safe_load(SHARED.read_text())
    data["regions"]["us-east"]["kafka"] = home
    data["regions"]["eu-west"]["kafka"] = region
    for region, pool in (("us-east", "raas-us"), ("eu-west", "raas-eu"), ("eu-north", "raas-no")):
        data["regions"][region]["pools"][pool]["threads"] = 1
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _last_loads(bootstrap: str, topics: JobTopics) -> dict[str, Metric]:
    """Per RaaS node, its last ``raas.weights_loaded`` metric (labels: the cluster it read from)."""
    last: dict[str, Metric] = {}
    for _, _, m in read_topic(bootstrap, topics.metrics):
        if isinstance(m, Metric) and m.name == "raas.weights_loaded":
            last[m.labels.get("node", m.component)] = m
    return last


@pytest.mark.slow
@pytest.mark.core  # ~40 s: `make test` runs it
@pytest.mark.timeout(2400)  # 3 node hosts, a MirrorMaker JVM and two brokers on 2 busy cores
def test_three_hosts_and_the_mirror_as_processes_on_a_shared_regional_cluster(tmp_path, bootstrap,
                                                                               region_cluster):  # noqa: F811
    jobs = _job_files(tmp_path)
    cfg = load_config(jobs["us-0"])
    assert "PRIVATE KEY" not in Path(load_config(jobs["remote"]).trainer.verify_key).read_text()
    topology = _topology_file(tmp_path, bootstrap, region_cluster.bootstrap_servers)
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())  # as on a real home cluster (`astraflow launch` does this)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs: dict[str, Path] = {}
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, argv: list[str]) -> None:
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "w") as out:
            procs[name] = subprocess.Popen([sys.executable, "-m", "astraflow", *argv], stdout=out,
                                           stderr=subprocess.STDOUT, env=env)

    try:
        # eu-north's mirror command: the shared cluster's one mirror (eu-west's names and claim)
        start("mirror", ["mirror", "--topology", str(topology), "--region", "eu-north", "--config",
                         str(jobs["remote"]), "--run-dir", str(tmp_path / "mirror")])
        for host in HOSTS:  # each host its own run dir, as on separate machines
            start(host, ["node", "--topology", str(topology), "--host", host, "--config",
                         str(jobs["us-0" if host == "us-0" else "remote"]), "--run-dir", str(tmp_path / host)])
        codes = {}
        for name in ("us-0", "eu-0", "no-0", "mirror"):  # each stops on its own once the trainer is done
            try:
                codes[name] = procs[name].wait(timeout=1800)
            except subprocess.TimeoutExpired:
                codes[name] = None
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    text = {name: path.read_text() for name, path in logs.items()}
    assert codes == {"us-0": 0, "eu-0": 0, "no-0": 0, "mirror": 0}, {n: t[-3000:] for n, t in text.items()}
    assert "host us-0: dataflow, trainer" in text["us-0"]
    for host in ("eu-0", "no-0"):  # no trainer of their own: they stopped when the trainer said done
        assert text[host].rstrip().endswith(f"host {host}: done"), text[host][-2000:]
    # eu-north's mirror command is eu-west's mirror (its names, its claim)
    assert "region eu-north shares region eu-west's cluster" in text["mirror"], text["mirror"][-2000:]
    assert "mirror eu-west: done" in text["mirror"], text["mirror"][-2000:]
    assert "weights from region eu-west's own cluster" in text["no-0"], text["no-0"][-2000:]

    # nothing lost, nothing trained twice; nothing refused (every host checks the others' signatures)
    for name in ("us-0", "eu-0", "no-0"):
        logs_dir = tmp_path / name / "logs"
        refused = [line for f in logs_dir.glob("*.log") for line in f.read_text().splitlines() if "wrong_key" in line]
        assert not refused, refused[:3]
    audits = audit_job(bootstrap, cfg)  # counting only groups the pool's key signed
    report = audits[cfg.policy]
    assert report.ok and audits["episodes"].ok and report.batches == STEPS, report.violations[:10]

    # every remote RaaS node read its weights from the shared regional cluster, the home one from home
    loads = _last_loads(bootstrap, topics)
    assert set(loads) >= {"raas-us-0", "raas-eu-0", "raas-no-0"}, sorted(loads)
    for node in ("raas-eu-0", "raas-no-0"):
        assert loads[node].labels["bootstrap"] == region_cluster.bootstrap_servers, loads[node].labels
        assert int(loads[node].value) >= 2, loads[node]  # v0 and at least one version it trained into
    assert loads["raas-us-0"].labels["bootstrap"] == bootstrap, loads["raas-us-0"].labels

    # one mirror filled the shared cluster: each weight record is there once
    copies = _records(region_cluster.bootstrap_servers, weight_topics(topics))
    assert copies and len(copies) == len(set(copies))
