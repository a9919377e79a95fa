"""Config bounds: every numeric key has a declared range, nonsense is refused at load time
naming the dotted key and the file, a key given twice is an error, and names that become
path and topic parts are safe. Job configs and topology files share the loader."""

from __future__ import annotations

import dataclasses
import socket
import types
import typing
from pathlib import Path

import pytest
import yaml

from astraflow.algorithms.registry import ALGORITHMS
from astraflow.config import JobConfig, load_config
from astraflow.topics.bootstrap import BadBootstrapServers, BrokerUnreachable, parse_bootstrap, wait_reachable
from astraflow.topology.schema import Topology, TopologyError
from astraflow.topology.validation import load_topology
from astraflow.typed_config import Bounds, ConfigError, check_name

ROOT = Path(__file__).resolve().parents[2]


def _numeric(tp) -> bool:
    """A number, or an optional number, or a list / mapping of numbers."""
    if tp in (int, float):
        return True
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, tuple, dict) or str(origin) == "<class 'collections.abc.Mapping'>":
        return any(_numeric(a) for a in typing.get_args(tp) if a is not Ellipsis)
    return False


def _numeric_fields(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, f"{prefix}{f.name}.")
            continue
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        sections = [a for a in args if dataclasses.is_dataclass(a)]
        if origin in (typing.Union, types.UnionType) and sections:  # an optional section
            yield from _numeric_fields(sections[0], f"{prefix}{f.name}.")
        elif origin is dict and sections:  # name -> section
            yield from _numeric_fields(sections[0], f"{prefix}{f.name}.<name>.")
        elif origin is tuple and sections:  # a list of sections
            yield from _numeric_fields(sections[0], f"{prefix}{f.name}[i].")
        elif _numeric(tp):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            yield f"{prefix}{f.name}", f, default


SECTIONS = [(JobConfig, "job"), (Topology, "topology")] + [(c.Params, f"algorithm {n}") for n, c in ALGORITHMS.items()]


@pytest.mark.parametrize("cls,what", SECTIONS, ids=[w for _, w in SECTIONS])
def test_every_numeric_key_declares_bounds_that_hold_its_default(cls, what):
    fields = list(_numeric_fields(cls))
    assert fields or cls.__name__ == "NoParams"
    unbounded = [key for key, f, _ in fields if not isinstance(f.metadata.get("bounds"), Bounds)]
    assert not unbounded, f"{what}: numeric keys without Bounds: {unbounded}"
    for key, f, default in fields:
        values = default.values() if isinstance(default, dict) else default if isinstance(default, tuple) else [default]
        for v in values:
            assert v is None or f.metadata["bounds"].admits(v), (key, v, f.metadata["bounds"])


def _load(tmp_path, text: str, **overrides):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path, (lambda: load_config(path, overrides or None))


@pytest.mark.parametrize("text,overrides,key,words", [
    ("job: x\ndataflow:\n  groups_per_batch: 0\n", {}, "dataflow.groups_per_batch", "must be in [1, 100000], got 0"),
    ("job: x\ntrainer:\n  steps: 100000000000000000000000000000000000000\n", {}, "trainer.steps",
     "must be in [1, 10000000]"),
    ("job: x\n", {"trainer.steps": 1e38}, "trainer.steps", "expected int, got float"),
    ("job: x\ntrainer:\n  engine:\n    lr: .inf\n", {}, "trainer.engine.lr", "must be a finite number, got inf"),
    ("job: x\nrollout:\n  temperature: .nan\n", {}, "rollout.temperature", "must be a finite number, got nan"),
    ("job: x\nrollout:\n  temperature: 0\n", {}, "rollout.temperature", "must be in (0, 100], got 0"),
    ("job: x\ntrainer:\n  engine:\n    betas: [0.9, 1.0]\n", {}, "trainer.engine.betas[1]", "must be in [0, 1), got 1.0"),
    ("job: x\ntrainer:\n  engine:\n    loss_params: {clip_eps: -.inf}\n", {}, "trainer.engine.loss_params.clip_eps",
     "finite"),
    ("job: x\nrollout:\n  device: {kind: emulated, profile: h100-qwen3-8b, dilation: -1}\n", {},
     "rollout.device.dilation", "must be in (0, 1000000]"),
    ("job: x\ndataflow:\n  algorithms: [{name: replay, capacity: 0}]\n", {}, "dataflow.algorithms[0].capacity",
     "must be in [1, 10000000], got 0"),
    ("job: x\nkafka:\n  task_partitions: 1000000\n", {}, "kafka.task_partitions", "must be in [1, 10000]"),
    ("job: x\nseed: -1\n", {}, "seed", "must be in [0, 4294967295], got -1"),
    ("job: x\npolicies:\n  a: {trainer: {steps: 0}}\n", {}, "policies.a.trainer.steps", "got 0"),
])
def test_numbers_outside_their_bounds_name_the_dotted_key_and_file(tmp_path, text, overrides, key, words):
    path, load = _load(tmp_path, text, **overrides)
    with pytest.raises(ConfigError) as e:
        load()
    assert (e.value.file, e.value.key) == (str(path), key), str(e.value)
    assert words in e.value.problem, str(e.value)


def test_a_number_beyond_any_float_is_refused_not_overflowed(tmp_path):
    path, load = _load(tmp_path, "job: x\ntrainer:\n  engine:\n    lr: " + "9" * 400 + "\n")
    with pytest.raises(ConfigError, match=r"trainer\.engine\.lr: must be a finite number, got 9+\.\.\.\(400 char"):
        load()


@pytest.mark.parametrize("text,key,lines", [
    ("job: x\njob: y\n", "job", "lines 1 and 2"),
    ("job: x\ntrainer:\n  steps: 3\n  engine: {lr: 0.1}\n  steps: 4\n", "trainer.steps", "lines 3 and 5"),
    ("job: x\ndataflow:\n  algorithms:\n  - {name: replay, ratio: 0.3, ratio: 0.4}\n", "dataflow.algorithms[0].ratio",
     "lines 4 and 4"),
])
def test_a_key_given_twice_is_refused_naming_key_file_and_lines(tmp_path, text, key, lines):
    path, load = _load(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load()
    assert (e.value.file, e.value.key) == (str(path), key)
    assert f"given twice ({lines})" in e.value.problem


def test_merge_keys_are_not_duplicates(tmp_path):
    _, load = _load(tmp_path, "job: x\nrollout: &r {n_samples: 4}\ntrainer:\n  engine:\n    <<: {lr: 0.01}\n"
                              "    grad_clip: 0.5\n")
    cfg = load()
    assert (cfg.rollout.n_samples, cfg.trainer.engine.lr, cfg.trainer.engine.grad_clip) == (4, 0.01, 0.5)


@pytest.mark.parametrize("text,key", [
    ("job: x\npolicy: ..\n", "policy"),
    ("job: ..\n", "job"),
    ("job: .hidden\n", "job"),
    ("job: -rf\n", "job"),
    ("job: a/b\n", "job"),
    ("job: x\npolicies:\n  ..: {}\n", "policies..."),
])
def test_names_used_as_path_parts_are_refused(tmp_path, text, key):
    path, load = _load(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load()
    assert (e.value.file, e.value.key) == (str(path), key)
    assert "is part of Kafka topic names and file paths" in e.value.problem


def test_safe_names_pass():
    assert all(check_name(n) is None for n in ("policy", "e2e-1a2b", "solver.v2", "A_b", "x" * 120))
    assert all(check_name(n) for n in (".", "..", "", "x" * 121, "a b", "ü", 3, None))


def test_an_override_into_a_scalar_names_the_key(tmp_path):
    path, load = _load(tmp_path, "job: x\n", **{"trainer.steps.x": 1})
    with pytest.raises(ConfigError, match="trainer.steps: expected int, got dict"):
        load()
    path, load = _load(tmp_path, "job: x\ntrainer: 3\n", **{"trainer.steps": 1})
    with pytest.raises(ConfigError, match=r"job.yaml: trainer: is not a section, so trainer.steps cannot be set"):
        load()


def test_a_directory_or_a_binary_file_as_the_config_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=rf"{tmp_path}: <file>: is a directory; give the YAML file"):
        load_config(tmp_path)
    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"\xff\xfe\x00job")
    with pytest.raises(ConfigError, match=r"job.yaml: <file>: not a text file"):
        load_config(binary)


def _topology(tmp_path, text: str) -> Path:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    return path


TOPO = """name: t
regions:
  r:
    kafka: embedded
    hosts: [h]
    pools:
      dataflow: {component: dataflow, hosts: [h]}
      trainer: {component: trainer, hosts: [h]}
      raas: {component: raas, hosts: [h], count: 1}
"""


@pytest.mark.parametrize("edit,key,words", [
    (lambda t: t + "name: u\n", "name", "given twice (lines 1 and 10)"),
    (lambda t: t.replace("count: 1}", "count: 1, speed: .inf}"), "regions.r.pools.raas.speed", "finite"),
    (lambda t: t.replace("count: 1}", "count: 100000}"), "regions.r.pools.raas.count", "must be in [0, 10000]"),
    (lambda t: t.replace("      raas:", "      ..:"), "regions.r.pools...", "is part of Kafka topic names"),
    (lambda t: t.replace("kafka: embedded", "kafka: 'broker:notaport'"), "regions.r.kafka", "has port 'notaport'"),
    (lambda t: t + "autoscaler: {interval_s: 0}\n", "autoscaler.interval_s", "must be in (0, 86400], got 0"),
])
def test_topology_files_share_the_bounds_and_the_strict_loader(tmp_path, edit, key, words):
    assert load_topology(_topology(tmp_path, TOPO)).name == "t"
    with pytest.raises(TopologyError) as e:
        load_topology(_topology(tmp_path, edit(TOPO)))
    assert (e.value.file, e.value.key) == (str(tmp_path / "topo.yaml"), key), str(e.value)
    assert words in e.value.problem, str(e.value)


def test_the_shipped_examples_still_load():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        (load_topology if "regions" in data else load_config)(path)


@pytest.mark.parametrize("servers,words", [
    ("localhost:notaport", "'localhost:notaport' has port 'notaport'"),
    ("localhost", "'localhost' is not host:port"),
    ("a:9092,,b:9092", "'' is not host:port"),
    ("a:70000", "has port '70000'"),
    ("", "expected host:port"),
])
def test_bad_bootstrap_servers_name_the_input(servers, words):
    with pytest.raises(BadBootstrapServers) as e:
        parse_bootstrap(servers, "--bootstrap-servers")
    assert str(e.value).startswith("--bootstrap-servers: ") and words in str(e.value)
    assert not e.value.retriable


def test_bootstrap_servers_parse():
    assert parse_bootstrap("a:1, SASL_SSL://b.c:9093,[::1]:9094") == [("a", 1), ("b.c", 9093), ("::1", 9094)]


def test_a_reachable_broker_passes_and_a_closed_port_fails_within_the_bound(bootstrap):
    wait_reachable(bootstrap, "--bootstrap-servers", timeout_s=5)
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(BrokerUnreachable) as e:
            wait_reachable(f"127.0.0.1:{port}", "kafka.bootstrap_servers of job.yaml", timeout_s=0.5)
    assert str(e.value).startswith(f"kafka.bootstrap_servers of job.yaml 127.0.0.1:{port}: no broker accepted")
    assert "within 0.5 s" in str(e.value) and e.value.retriable


@pytest.mark.parametrize("text,key,words", [
    ("job: {config: JOB}\nseed: 1\nseed: 2\n", "seed", "given twice (lines 2 and 3)"),
    ("job: {config: JOB}\nname: ../../etc\n", "name", "is part of Kafka topic names and file paths"),
    ("job: {config: JOB}\ntimeout_s: .inf\n", "timeout_s", "must be a finite number"),
    ("job: {config: JOB}\nsettle_s: .nan\n", "settle_s", "must be a finite number"),
])
def test_chaos_scenarios_share_the_strict_loader(tmp_path, text, key, words):
    from astraflow.chaos.scenario import ScenarioError, load_scenario
    path = tmp_path / "sc.yaml"
    path.write_text(text.replace("JOB", str(ROOT / "examples" / "arithmetic_grpo.yaml")))
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert (e.value.file, e.value.key) == (str(path), key), str(e.value)
    assert words in e.value.problem, str(e.value)
