"""The topology's links as `astraflow launch` emulates them: the plan's wording, and the wiring
(a region's nodes run inside its network namespace and dial the broker's listener advertised at
the link, the Kafka region's dial the broker) with a real broker and a real client in the region.
The link itself (shared bandwidth, latency, cuts) is tested in test_links.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from astraflow.config import load_config
from astraflow.topics import EmbeddedBroker, TopicSpec, ensure_topics
from astraflow.topology.launch import TopologyRun, load_plan, node_command_for
from astraflow.topology.plan import format_plan, resolve, without_emulation
from astraflow.topology.schema import TopologyError
from astraflow.topology.validation import load_topology

ROOT = Path(__file__).resolve().parents[2]
TWO_REGIONS = ROOT / "examples" / "topology_two_regions.yaml"
JOB = ROOT / "examples" / "arithmetic_grpo.yaml"

IN_REGION = textwrap.dedent("""
    import json, secrets, sys
    from astraflow.topics import Consumer, Producer, Prompt
    bootstrap, topic = sys.argv[1], sys.argv[2]
    p = Producer(bootstrap, client_id="eu-node", transactional_id=topic + "-tx")
    with p.transaction():
        for i in range(5):
            p.send(topic, Prompt(f"p{i}", secrets.token_urlsafe(3000), "1"))  # ~3 KB after zstd
    ports = sorted({b.port for b in p._kp._metadata.brokers()})
    p.close()
    got = []
    with Consumer(bootstrap, topics=[topic], group_id=topic + "-g", client_id="eu-reader") as c:
        for _ in range(30):
            got += [d.message.prompt_id for d in c.poll(1000)]
            if len(got) >= 5:
                break
        c.commit()
    print(json.dumps({"got": got, "ports": ports}))
""")


def test_a_region_reaches_a_real_broker_through_its_link_from_its_own_namespace(tmp_path):
    """launch's wiring without the job: the plan's remote region gets a namespace, a link and
    a listener advertised at the link; a transactional producer and a read_committed consumer
    run inside the region through it; node commands of the region, the autoscaler's too, run
    in the region and name the link, while the Kafka region's name the broker."""
    cfg = load_config(str(JOB), {})
    plan = load_plan(TWO_REGIONS, cfg)
    run = TopologyRun(plan, cfg, [])
    broker = EmbeddedBroker(tmp_path / "kafka", heap="256m")
    with run.broker_setup(broker):
        try:
            broker.start()
            link = run.wan["eu-west"]
            eu = run.wan.bootstrap_for()["eu-west"]
            assert set(run.wan.bootstrap_for()) == {"eu-west"} and eu.startswith(link.link_ip + ":")
            topic = "wan-" + uuid.uuid4().hex[:8]
            ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, partitions=1)])
            out = subprocess.run(link.wrap([sys.executable, "-c", IN_REGION, eu, topic]), capture_output=True,
                                 text=True, timeout=180)
            assert out.returncode == 0, out.stderr[-3000:]
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["got"] == [f"p{i}" for i in range(5)]
            # the broker told the client to come back through the link, not to its own port
            assert result["ports"] == [int(eu.rsplit(":", 1)[1])]
            stats = run.wan.stats()[0]
            assert (stats["region"], stats["latency_ms"], stats["bandwidth_mbps"]) == ("eu-west", 40, 1000)
            assert stats["bytes_up"] > 5 * 2000 and stats["bytes_down"] > 5 * 2000, stats

            links = run.wan
            command_for = node_command_for(cfg, broker.bootstrap_servers, tmp_path, [], links.bootstrap_for(),
                                           {r: links[r].wrap for r in links.links})
            nodes = {n.node_id: n for n in plan.nodes}

            def server_of(argv):
                return argv[argv.index("--bootstrap-servers") + 1]
            eu_cmd = command_for(nodes["raas-eu-0"])
            assert server_of(eu_cmd) == eu and eu_cmd[:len(link.wrap([]))] == link.wrap([])
            for home in ("raas-us-0", "trainer"):
                cmd = command_for(nodes[home])
                assert server_of(cmd) == broker.bootstrap_servers and "nsenter" not in cmd[0]
            # an elastic node the autoscaler adds later is started through the same command_for
            later = command_for(plan.node_spec(plan.pools["raas-eu"], 5))
            assert server_of(later) == eu and later[0] == eu_cmd[0]
        finally:
            broker.stop()
    assert link._closed  # leaving broker_setup closed the link


def _two_regions(tmp_path, **changes) -> Path:
    data = yaml.safe_load(TWO_REGIONS.read_text())
    data.update(changes)
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_plan_says_whether_links_are_emulated(tmp_path):
    plan = resolve(load_topology(TWO_REGIONS))
    assert plan.emulate_links and plan.kafka_region == "us-east"
    assert plan.emulated_links() == [{"region": "eu-west", "kafka_region": "us-east", "latency_ms": 40,
                                      "bandwidth_mbps": 1000, "own_cluster": False}]
    text = format_plan(plan)
    assert "[EMULATED by launch" in text and "adding 40 ms each way" in text
    assert plan.to_dict()["emulated_links"][0]["region"] == "eu-west"

    off = resolve(load_topology(_two_regions(tmp_path, emulate_links=False)))
    assert off.emulated_links() == [] and "[not emulated]" in format_plan(off)
    assert "emulate_links: false" in format_plan(off)

    data = yaml.safe_load(TWO_REGIONS.read_text())
    data["regions"]["us-east"]["kafka"] = "10.0.0.1:9092"
    path = tmp_path / "external.yaml"
    path.write_text(yaml.safe_dump(data))
    external = resolve(load_topology(path))
    assert external.emulated_links() == []
    assert "the Kafka cluster is external (10.0.0.1:9092)" in format_plan(external)

    # launch --bootstrap-servers: the file's embedded broker is replaced, so nothing is emulated
    plan = resolve(load_topology(TWO_REGIONS))
    without_emulation(plan, "10.0.0.2:9092")
    assert plan.emulated_links() == [] and "[not emulated]" in format_plan(plan)
    assert any("uses the existing cluster 10.0.0.2:9092" in n for n in plan.notes)
    assert not any(n.startswith("EMULATION of links") for n in plan.notes)


@pytest.mark.parametrize("value", ["maybe", 1, [True]])
def test_a_bad_emulate_links_names_key_and_file(tmp_path, value):
    path = _two_regions(tmp_path, emulate_links=value)
    with pytest.raises(TopologyError) as e:
        load_topology(path)
    assert e.value.file == str(path) and e.value.key == "emulate_links", str(e.value)


def launch_short_job(topology: Path, run_dir: Path, name: str, timeout: float) -> dict:
    """``astraflow launch`` of ``topology`` with the demo job for 4 steps, no evaluation; it
    must exit 0 with the audit ok. Its ``summary.json``."""
    out = subprocess.run([sys.executable, "-m", "astraflow", "launch", str(topology), str(JOB), "--quiet",
                          "--run-dir", str(run_dir), "--set", "trainer.steps=4", "--set", "eval.every=0",
                          "--set", f"job={name}-{uuid.uuid4().hex[:6]}"],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "conservation audit ok" in out.stdout
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_a_two_region_launch_trains_through_the_emulated_link_and_loses_nothing(tmp_path):
    """`astraflow launch` of the two-region example: the eu-west node runs in its namespace,
    every byte it moves crosses the link (its weights too), and the audit holds."""
    summary = launch_short_job(TWO_REGIONS, tmp_path / "run", "two-regions", timeout=900)
    (link,) = summary["topology"]["emulated_links"]
    assert link["region"] == "eu-west" and link["connections"] >= 2
    assert link["bytes_down"] > 1_000_000 and link["bytes_up"] > 0  # the weights came down the link
    # the eu-west node was alive at home's broker (its heartbeats crossed the link) for the run
    assert summary["device_hours"]["pools"]["raas-eu"]["node_hours"] > 0
