"""A region whose topology entry names an existing Kafka cluster (bootstrap servers) instead of
'embedded': `astraflow launch` runs its MirrorMaker 2 from home (topology/launch.py,
topology/regional.py), `astraflow node --topology` points the region's RaaS nodes at it, and
`astraflow mirror --topology F --region R` (topology/mirror_run.py) runs and restarts its
MirrorMaker 2 on a multi-host deployment. The "existing" clusters are real embedded brokers
started by the tests (the session broker as home, one more as the region); MirrorMaker 2 is the
real one. Links are not emulated with existing clusters (emulation needs a broker launch starts)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from astraflow.config import load_config
from astraflow.topics import EmbeddedBroker, JobTopics, Metric, Producer, ensure_topics
from astraflow.topics.replay import read_topic
from astraflow.topology.launch import load_plan, node_command_for
from astraflow.topology.mirror_run import run_mirror
from astraflow.topology.plan import check_multi_host, own_clusters
from astraflow.topology.schema import TopologyError
from astraflow.weights import WeightPublisher, WeightSubscriber
from astraflow.weights.codec import weights_digest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "topology_two_regions_existing.yaml"
JOB = ROOT / "examples" / "arithmetic_grpo.yaml"


def _topology(tmp_path: Path, home: str, region: str, **eu) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["regions"]["us-east"]["kafka"] = home
    data["regions"]["eu-west"]["kafka"] = region
    data["regions"]["eu-west"].update(eu)
    path = tmp_path / f"topo-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _history(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    out = [{"embed": torch.randn(512, 256, generator=g), "proj": torch.randn(256, 256, generator=g)}]
    for v in range(1, n):
        nxt = {k: t.clone() for k, t in out[-1].items()}
        nxt["embed"][v] += 0.5  # a sparse step
        out.append(nxt)
    return out


def _publish(pub: WeightPublisher, history, versions) -> None:
    for v in versions:
        pub.publish(history[v], v)
        pub.flush(60)


def _read_in_region(region: str, topics: JobTopics, version: int, digest: str, readers: int = 2) -> None:
    subs = [WeightSubscriber(region, topics, "policy", node_id=f"eu-{i}-{uuid.uuid4().hex[:4]}").start()
            for i in range(readers)]
    try:
        for s in subs:
            assert s.wait_for(version, timeout=180), s.faults
            assert s.digest() == digest
    finally:
        for s in subs:
            s.close()


@pytest.fixture(scope="module")
def region_cluster(tmp_path_factory):
    """A second real cluster standing in for the region's existing one."""
    broker = EmbeddedBroker(tmp_path_factory.mktemp("eu-kafka"), heap="384m").start()
    try:
        yield broker
    finally:
        broker.close()


def test_the_example_passes_check_and_names_who_runs_the_mirror():
    out = subprocess.run([sys.executable, "-m", "astraflow", "topology", "check", str(EXAMPLE), "--job", str(JOB)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "valid" in out.stderr and "refuses" not in out.stderr
    assert "bootstrap 10.1.0.1:9092: region(s) eu-west [own cluster" in out.stdout
    assert "astraflow mirror --topology" in out.stdout and "--region eu-west" in out.stdout


def test_on_hosts_the_regions_nodes_read_weights_from_its_cluster_and_the_rest_from_home(tmp_path):
    cfg = load_config(str(JOB), {})
    plan = load_plan(EXAMPLE, cfg)
    check_multi_host(plan)  # node --topology and mirror take it
    own = {r: c.name for r, c in own_clusters(plan).items()}
    assert own == {"eu-west": "10.1.0.1:9092"}
    command_for = node_command_for(cfg, "10.0.0.1:9092", tmp_path, [], region_weights=own)
    for node in plan.nodes:
        cmd = command_for(node)
        assert cmd[cmd.index("--bootstrap-servers") + 1] == "10.0.0.1:9092"  # tasks, trajectories, control: home
        weights = [a for a in cmd if "weights_bootstrap" in a]
        assert weights == (["rollout.weights_bootstrap_servers=10.1.0.1:9092"] if node.region == "eu-west" else [])


def test_mirror_refusals_name_the_key_and_the_file(tmp_path):
    cfg = load_config(str(JOB), {})
    with pytest.raises(TopologyError) as e:
        run_mirror(EXAMPLE, cfg, "us-east", bootstrap=None, run_dir=tmp_path)
    assert (e.value.file, e.value.key) == (str(EXAMPLE), "regions.us-east.kafka") and "nothing to mirror" in str(e.value)
    with pytest.raises(TopologyError) as e:
        run_mirror(EXAMPLE, cfg, "mars", bootstrap=None, run_dir=tmp_path)
    assert e.value.key == "--region" and "eu-west" in str(e.value)
    path = _topology(tmp_path, "10.0.0.1:9092", "embedded")
    with pytest.raises(TopologyError) as e:
        run_mirror(path, cfg, "eu-west", bootstrap=None, run_dir=tmp_path)
    assert (e.value.file, e.value.key) == (str(path), "regions.eu-west.kafka") and "'embedded'" in str(e.value)


def _topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        cfg = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        return {k: e["value"] for k, e in cfg["topic"][topic].items()}
    finally:
        admin.close()


def _trainer_done(bootstrap: str, topics: JobTopics) -> None:
    """The trainer's "done" metric: a mirror command stops after it."""
    with contextlib.closing(Producer(bootstrap, client_id="test-trainer")) as p:
        p.send(topics.metrics, Metric("trainer.policy", "trainer.done", 1.0), key="trainer.policy", trace=False)
        p.flush()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM a process still running, SIGKILL it if it does not end within 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _mm2_pid(work_dir: Path) -> int | None:
    """The MirrorMaker JVM whose command line names this test's mm2.properties (our own child's child)."""
    needle = str(work_dir / "mm2.properties")
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    return int(d.name)
            except OSError:
                continue
    return None


@pytest.mark.slow
def test_the_mirror_command_copies_weights_restarts_mirrormaker_and_stops_when_the_trainer_is_done(
        tmp_path, bootstrap, region_cluster):
    """`astraflow mirror --topology F --region eu-west` as a process: readers on the region's
    cluster reach every version; MirrorMaker 2 SIGKILLed mid-run is restarted and the next versions
    arrive; `astraflow status` shows the region's mirror; `trainer.done` at home ends it with 0."""
    job = "mx" + uuid.uuid4().hex[:8]
    cfg = load_config(str(JOB), {"job": job})
    path = _topology(tmp_path, bootstrap, region_cluster.bootstrap_servers)
    topics = JobTopics(job=job, policies=("policy",), task_partitions=2, trajectory_partitions=1)
    ensure_topics(bootstrap, topics.specs())
    history = _history(6)
    run_dir = tmp_path / "run"
    log = open(tmp_path / "mirror.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "mirror", "--topology", str(path), "--region",
                             "eu-west", "--config", str(JOB), "--set", f"job={job}", "--run-dir", str(run_dir)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    mm2_dir = run_dir / "regions" / "eu-west" / "mirror"
    pub = WeightPublisher(bootstrap, topics, "policy", snapshot_every=2, chunk_size=64 * 1024)
    try:
        _publish(pub, history, range(3))
        _read_in_region(region_cluster.bootstrap_servers, topics, 2, weights_digest(history[2]))
        first = _mm2_pid(mm2_dir)
        assert first is not None
        os.kill(first, signal.SIGKILL)  # the command restarts it; it resumes from its committed offsets
        _publish(pub, history, range(3, 6))
        _read_in_region(region_cluster.bootstrap_servers, topics, 5, weights_digest(history[5]), readers=1)
        second = _mm2_pid(mm2_dir)
        assert second is not None and second != first
        # the command reports the region to home's metrics, for `astraflow status`
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lags = [m for _, _, m in read_topic(bootstrap, topics.metrics)
                    if isinstance(m, Metric) and m.name == "region.mirror_lag_versions"]
            if lags and lags[-1].value == 0:
                break
            time.sleep(5)
        assert lags and lags[-1].value == 0 and lags[-1].labels["cluster"] == "eu-west (own)", lags[-1:]
        from astraflow.status import format_status, job_status
        from astraflow.topology.region_watch import MirroredWeights
        home = MirroredWeights(bootstrap, topics.versions)
        try:
            published = home.update()
        finally:
            home.close()
        deadline = time.monotonic() + 60
        while True:  # the bytes the mirror delivered: each version's payload once, as published at home
            eu = job_status(bootstrap, job)["regions"]["eu-west"]
            if (eu["mirrored_weight_bytes"], eu["mirrored_versions"]) == published or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert (eu["mirrored_weight_bytes"], eu["mirrored_versions"]) == published and published[1] == 6, eu
        assert f"mirrored {published[0]:,} B of weights (6 versions)" in format_status(job_status(bootstrap, job))
        _trainer_done(bootstrap, topics)
        assert proc.wait(timeout=120) == 0
    finally:
        pub.close()
        _stop(proc)
        log.close()
    text = (tmp_path / "mirror.log").read_text()
    assert "restart 1" in text and "mirror eu-west: done" in text, text
    assert _mm2_pid(mm2_dir) is None  # no MirrorMaker outlives the command


@pytest.mark.slow
def test_a_launch_with_an_existing_regional_cluster_reads_weights_there(tmp_path, region_cluster):
    """`astraflow launch` of the mirrored example with eu-west's kafka naming an existing cluster:
    home is the embedded broker launch starts, eu-west gets MirrorMaker 2 into its cluster, both
    eu-west nodes load every version from there, the audit holds and the cluster outlives the run."""
    from tests.topology.test_wan import launch_short_job
    data = yaml.safe_load((ROOT / "examples" / "topology_two_regions_mirrored.yaml").read_text())
    data["regions"]["eu-west"]["kafka"] = region_cluster.bootstrap_servers
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    summary = launch_short_job(path, tmp_path / "run", "existing", timeout=1500)
    topo = summary["topology"]
    assert topo["emulated_links"] == []  # not emulated with an existing regional cluster
    sources = topo["weights_from"]
    for node in ("raas-eu-0", "raas-eu-1"):
        assert sources[node]["cluster"] == "eu-west (own)", sources
        assert sources[node]["bootstrap"] == region_cluster.bootstrap_servers and sources[node]["versions_loaded"] >= 4
    assert sources["raas-us-0"]["cluster"] == "home"
    eu = topo["regional_clusters"]["eu-west"]
    assert eu["existing"] and eu["log"] is None  # nothing of it was started by launch
    assert eu["mirror"]["mirrored_records"] > 0 and set(eu["mirror"]["lag_records"].values()) == {0}
    weights = next(t for t in eu["mirror"]["topics"] if ".weights." in t)
    configs = _topic_configs(region_cluster.bootstrap_servers, weights)
    assert int(configs["retention.bytes"]) > 0 and int(configs["retention.ms"]) > 0  # its own bound, not home's -1
    assert region_cluster.exit_code() is None  # an existing cluster outlives the run


def _mirror_cmd(path: Path, job: str, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "astraflow", "mirror", "--topology", str(path), "--region", "eu-west",
            "--config", str(JOB), "--set", f"job={job}", "--run-dir", str(run_dir)]


def _wait_for_line(path: Path, needle: str, proc: subprocess.Popen, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if needle in text:
            return text
        assert proc.poll() is None, f"exited {proc.returncode} before {needle!r}:\n{text}"
        time.sleep(0.5)
    raise AssertionError(f"no {needle!r} within {timeout:.0f} s:\n{path.read_text()}")


@pytest.mark.slow
def test_a_second_mirror_command_for_the_same_target_is_refused_until_the_first_is_gone(
        tmp_path, bootstrap, region_cluster):
    """Two `astraflow mirror` commands for one job and region (as if on two hosts: their own run
    dirs): the second exits non-zero naming the first's pid and host, before starting anything;
    once the first is SIGKILLed (no clean leave: its claim lapses with its session) a third one
    takes the claim and runs MirrorMaker 2, and stops cleanly on SIGTERM."""
    job = "mc" + uuid.uuid4().hex[:8]
    path = _topology(tmp_path, bootstrap, region_cluster.bootstrap_servers)
    ensure_topics(bootstrap, JobTopics(job=job, policies=("policy",), task_partitions=2,
                                       trajectory_partitions=1).specs())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen] = []

    def start(name: str) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{name}.log"
        with open(log, "w") as out:
            procs.append(subprocess.Popen(_mirror_cmd(path, job, tmp_path / name), stdout=out,
                                          stderr=subprocess.STDOUT, env=env))
        return procs[-1], log

    try:
        first, first_log = start("a")
        _wait_for_line(first_log, "holds claim", first)
        second, second_log = start("b")
        assert second.wait(timeout=180) == 3  # fatal: a supervisor does not restart it
        refusal = second_log.read_text()
        print(refusal)  # (shown with -s: the message a user sees)
        assert "astraflow mirror eu-west already runs" in refusal, refusal
        assert f"pid {first.pid} on host" in refusal and f"astraflow.mirror.{job}" in refusal, refusal
        assert not (tmp_path / "b" / "regions" / "eu-west" / "mirror" / "mm2.properties").exists()  # nothing started
        assert first.poll() is None  # the refused one took nothing from the first
        _wait_for_line(first_log, "(MirrorMaker 2, dedicated", first)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        deadline = time.monotonic() + 60  # its MirrorMaker (if it got that far) dies with it
        while _mm2_pid(tmp_path / "a" / "regions" / "eu-west" / "mirror") is not None:
            assert time.monotonic() < deadline, "the killed command's MirrorMaker 2 outlived it"
            time.sleep(1)
        third, third_log = start("c")
        _wait_for_line(third_log, "holds claim", third)  # once the dead one's session lapsed
        mm2_dir = tmp_path / "c" / "regions" / "eu-west" / "mirror"
        deadline = time.monotonic() + 240
        while "finished initialization and start" not in ((mm2_dir / "mm2.log").read_text()
                                                          if (mm2_dir / "mm2.log").exists() else ""):
            assert third.poll() is None and time.monotonic() < deadline, third_log.read_text()
            time.sleep(1)
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=120) == 0, third_log.read_text()
        assert "mirror eu-west: done" in third_log.read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_launch_does_not_mirror_into_an_existing_cluster_while_a_mirror_command_holds_it(tmp_path, bootstrap,
                                                                                         region_cluster):
    """`astraflow launch` takes the same claim as `astraflow mirror` on an existing regional cluster:
    with the job's claim held there (as a running `astraflow mirror` holds it), launch's regions
    refuse to start, naming the holder, before any MirrorMaker; released, they would start."""
    from astraflow.topics.claim import ClaimRefused, ExclusiveClaim
    from astraflow.topology.launch import TopologyRun
    from astraflow.topology.job_mirror import claim_group
    job = "ml" + uuid.uuid4().hex[:8]
    cfg = load_config(str(JOB), {"job": job})
    plan = load_plan(_topology(tmp_path, bootstrap, region_cluster.bootstrap_servers), cfg)
    run = TopologyRun(plan, cfg, [])
    with ExclusiveClaim(region_cluster.bootstrap_servers, claim_group(job), "astraflow mirror eu-west"):
        with pytest.raises(ClaimRefused, match=f"astraflow-mirror-eu-west pid {os.getpid()}"):
            run.start_regions(bootstrap, tmp_path / "run")
    assert not (tmp_path / "run" / "regions" / "eu-west" / "mirror" / "mm2.properties").exists()
    assert run.claims == [] and all(not rc.mirror for rc in run.regions.values())


@pytest.mark.slow
def test_launch_holds_the_claim_while_its_mirror_runs_and_releases_it_after(tmp_path, bootstrap, region_cluster):
    from astraflow.topics.claim import ClaimRefused, ExclusiveClaim
    from astraflow.topology.launch import TopologyRun
    from astraflow.topology.job_mirror import claim_group
    job = "mh" + uuid.uuid4().hex[:8]
    cfg = load_config(str(JOB), {"job": job})
    plan = load_plan(_topology(tmp_path, bootstrap, region_cluster.bootstrap_servers), cfg)
    ensure_topics(bootstrap, JobTopics(job=job, policies=("policy",), task_partitions=2,
                                       trajectory_partitions=1).specs())
    run = TopologyRun(plan, cfg, [])
    try:
        run.start_regions(bootstrap, tmp_path / "run")
        assert [c.held for c in run.claims] == [True] and run.regions["eu-west"].mirror.running()
        with pytest.raises(ClaimRefused, match="astraflow-launch"):  # an `astraflow mirror` would be refused
            ExclusiveClaim(region_cluster.bootstrap_servers, claim_group(job), "astraflow mirror eu-west").acquire()
    finally:
        run.close_regions()
    assert run.claims == []
    with ExclusiveClaim(region_cluster.bootstrap_servers, claim_group(job), "astraflow mirror eu-west") as claim:
        assert claim.held  # at once: launch left the group when it closed its regions
