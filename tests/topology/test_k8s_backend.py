"""The autoscaler's Kubernetes backend (``topology/k8s_backend.py``) against fabric8's mock API server.

**The mock is a stand-in for the Kubernetes API, not a cluster** (``tests/topology/k8s_api.py``):
fabric8's ``kubernetes-server-mock`` in CRUD mode stores what it is sent and serves it back
over plain HTTP with no authentication; no controller, scheduler or kubelet runs. The backend
talks to it with the real ``kubernetes`` client through a kubeconfig file, as it would to a
cluster. The Deployment it scales is the one the Helm chart renders (``helm template``), so
names and selectors are the chart's. Because nothing turns replicas into pods, the test plays
the ReplicaSet controller (:class:`ControllerStandIn`, labelled as such): it creates pods up
to the replicas and deletes the excess in the controller's order (pending, then not ready,
then the lowest ``pod-deletion-cost``, then the newest). What Kubernetes does after that — the
kubelet's SIGTERM and grace period — is not exercised here.

The recorded pod list (``data/k8s_pods_raas_h100.json``, the shape of ``kubectl get pods -o
json``) checks membership parsing without any server: ready, loading, unschedulable,
terminating, evicted pods and a pod of another pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from kubernetes import client, config

from astraflow.config import load_config
from astraflow.topics import Metric, Producer, ensure_topics, job_topics
from astraflow.topics.replay import read_topic
from astraflow.topology.backends import BackendError
from astraflow.topology.k8s_backend import (DELETION_COST, RETIRE_COST, RETIRED, KubernetesBackend, pool_state,
                                            selector_string)
from astraflow.topology.launch import autoscaler_running, load_plan, make_backend
from astraflow.topology.schema import TopologyError

from tests.waiting import wait_until

from .k8s_api import MockApiServer

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "astraflow"
HELM = Path(os.environ.get("ASTRAFLOW_HELM", ROOT / ".tools" / "bin" / "helm"))
RECORDED = Path(__file__).with_name("data") / "k8s_pods_raas_h100.json"
RELEASE, POOL = "rel", "raas"
DEPLOYMENT = f"{RELEASE}-astraflow-raas-{POOL}"


# --- the stand-in API and the chart's Deployment --------------------------------------------------------------

@pytest.fixture(scope="module")
def mock_api():
    server = MockApiServer()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture(scope="module")
def kubeconfig(mock_api, tmp_path_factory) -> Path:
    """A kubeconfig naming the mock: plain http, a user with no credentials."""
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "mock",
        "clusters": [{"name": "mock", "cluster": {"server": mock_api}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "nobody"}}]}))
    return path


@pytest.fixture
def namespace() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def api(kubeconfig):
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def chart_deployment(replicas: int) -> dict:
    """The chart's RaaS Deployment for pool ``raas`` of release ``rel`` (``helm template``)."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: `make helm` builds it (make test does), or set ASTRAFLOW_HELM")
    # no GPUs: the chart writes nvidia.com/gpu as an int, which the API takes and the client's model refuses
    values = {"job": {"name": "j", "config": "job: j\n"}, "kafka": {"bootstrap": "kafka:9092"},
              "dataflow": {"enabled": False},
              "raasPools": [{"name": POOL, "policy": "policy", "replicas": replicas, "min": 1, "max": 4, "gpus": 0,
                             "resources": {"cpu": "4", "memory": "16Gi"}}]}
    env = {**os.environ, "HELM_CACHE_HOME": "/nonexistent-cache", "HELM_CONFIG_HOME": "/nonexistent-config"}
    out = subprocess.run([str(HELM), "template", RELEASE, str(CHART), "--show-only", "templates/raas.yaml",
                          "-f", "-"], input=yaml.safe_dump(values), capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    (dep,) = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert dep["metadata"]["name"] == DEPLOYMENT
    return dep


class ControllerStandIn:
    """STAND-IN for Kubernetes' ReplicaSet controller (the mock runs none): one :meth:`reconcile`
    makes the Deployment's pods match its replicas, as the controller would — new pods from the
    template (``Pending``; :meth:`make_ready` runs them), the excess deleted in the controller's
    order. :meth:`running` does it in the background, every 50 ms."""

    def __init__(self, api, namespace: str) -> None:
        self.apps, self.core, self.namespace = client.AppsV1Api(api), client.CoreV1Api(api), namespace
        self.hash = "5d8f7c9b6"
        self.created: list[str] = []
        self.deleted: list[str] = []

    def pods(self) -> list:
        dep = self.apps.read_namespaced_deployment(DEPLOYMENT, self.namespace)
        return [p for p in self.core.list_namespaced_pod(
            self.namespace, label_selector=selector_string(dep.spec.selector.match_labels)).items]

    def reconcile(self) -> None:
        dep = self.apps.read_namespaced_deployment(DEPLOYMENT, self.namespace)
        live = [p for p in self.pods() if p.metadata.deletion_timestamp is None
                and p.status.phase not in ("Succeeded", "Failed")]
        for _ in range(dep.spec.replicas - len(live)):
            name = f"{DEPLOYMENT}-{self.hash}-" + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            labels = {**dep.spec.template.metadata.labels, "pod-template-hash": self.hash}
            self.core.create_namespaced_pod(self.namespace, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": "raas", "image": "astraflow:0.1.0"}],
                         "terminationGracePeriodSeconds": 120},
                "status": {"phase": "Pending"}})
            self.created.append(name)
        if len(live) > dep.spec.replicas:
            def rank(p):  # the ReplicaSet controller's deletion order (the parts that apply here)
                ready = p.status.phase == "Running" and any(c.type == "Ready" and c.status == "True"
                                                            for c in p.status.conditions or [])
                cost = int((p.metadata.annotations or {}).get(DELETION_COST, "0"))
                return (p.status.phase != "Pending", ready, cost, -p.metadata.creation_timestamp.timestamp())
            for p in sorted(live, key=rank)[:len(live) - dep.spec.replicas]:
                self.core.delete_namespaced_pod(p.metadata.name, self.namespace)
                self.deleted.append(p.metadata.name)

    def make_ready(self, name: str | None = None) -> None:
        """The kubelet's part: pods (``name``, or all pending) run and pass readiness."""
        for p in self.pods():
            if (name is None and p.status.phase == "Pending") or p.metadata.name == name:
                self.core.patch_namespaced_pod(p.metadata.name, self.namespace, {"status": {
                    "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
                    _content_type="application/merge-patch+json")

    @contextlib.contextmanager
    def running(self):
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                self.reconcile()
                stop.wait(0.05)
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            yield self
        finally:
            stop.set()
            t.join(5)


@pytest.fixture
def pool(api, namespace):
    """The chart's Deployment (2 replicas) in a fresh namespace, its pods made and running."""
    client.AppsV1Api(api).create_namespaced_deployment(namespace, chart_deployment(replicas=2))
    controller = ControllerStandIn(api, namespace)
    controller.reconcile()
    controller.make_ready()
    return controller


def backend(api, namespace, **kw) -> KubernetesBackend:
    return KubernetesBackend(api, namespace, {POOL: DEPLOYMENT}, poll_s=0.05, **kw)


def replicas(api, namespace) -> int:
    return client.AppsV1Api(api).read_namespaced_deployment(DEPLOYMENT, namespace).spec.replicas


def topology(folder: Path, autoscaler: dict, pools: tuple[str, ...] = (POOL,)) -> Path:
    """A one-host topology with elastic RaaS pools ``pools`` and this ``autoscaler`` section."""
    topo = {"name": "k", "autoscaler": autoscaler, "regions": {"r": {"hosts": ["h"], "pools": {
        "dataflow": {"component": "dataflow", "hosts": ["h"]}, "trainer": {"component": "trainer", "hosts": ["h"]},
        **{p: {"component": "raas", "hosts": ["h"], "count": 2, "min": 1, "max": 4} for p in pools}}}}}
    path = folder / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


class _Node:  # what the autoscaler hands ``start`` (a NodePlan): only its pool matters here
    pool, node_id = POOL, f"{POOL}-7"


# --- against the stand-in API ---------------------------------------------------------------------------------

def test_members_are_the_deployments_pods_under_pool_prefixed_ids(api, namespace, pool):
    b = backend(api, namespace)
    pods = sorted(p.metadata.name for p in pool.pods())
    assert len(pods) == 2 and all(p.startswith(DEPLOYMENT + "-") for p in pods)
    assert sorted(b.members(POOL)) == sorted(f"{POOL}-{p}" for p in pods)
    assert sorted(b.ready(POOL)) == sorted(b.members(POOL))
    with pytest.raises(KeyError, match="not a pool of this backend"):
        b.members("other")


def test_scale_up_patches_the_replicas_and_returns_with_the_new_pod_a_member_before_it_is_ready(api, namespace,
                                                                                                pool):
    b = backend(api, namespace)
    before = set(b.members(POOL))
    with pool.running():
        b.start(_Node())
    assert replicas(api, namespace) == 3
    (new,) = set(b.members(POOL)) - before
    assert new == f"{POOL}-{pool.created[-1]}"
    assert new not in b.ready(POOL)  # pending: counted (it holds its place), not serving
    pool.make_ready()
    assert set(b.ready(POOL)) == before | {new}
    assert b.next_index(POOL) == 1  # planned ids keep moving on, though the pods name the nodes


def test_retire_marks_the_chosen_pod_cheapest_and_scales_down_so_the_controller_deletes_that_one(api, namespace,
                                                                                                 pool):
    b = backend(api, namespace)
    with pool.running():
        b.start(_Node())
    pool.make_ready()
    members = b.members(POOL)
    chosen = members[0]  # not the newest: the annotation, not the controller's default, picks the pod
    pod = chosen.removeprefix(f"{POOL}-")
    b.retire(chosen)
    notes = client.CoreV1Api(api).read_namespaced_pod(pod, namespace).metadata.annotations
    assert notes[DELETION_COST] == RETIRE_COST and RETIRED in notes
    assert replicas(api, namespace) == 2
    # before the controller acts the pod still runs, but it is no member: the autoscaler must not
    # pick it again for its next retirement
    assert b.members(POOL) == [m for m in members if m != chosen]
    assert b.state(POOL).leaving == [pod]
    pool.reconcile()
    assert pool.deleted == [pod]
    assert b.members(POOL) == [m for m in members if m != chosen]
    assert b.state(POOL).leaving == []


def test_a_marked_pod_the_controller_spared_is_a_member_again(api, namespace, pool):
    """The controller deletes a not-ready pod before any cheaper ready one: then the marked pod stays."""
    b = backend(api, namespace)
    with pool.running():
        b.start(_Node())  # a third pod, pending
    ready = b.ready(POOL)
    b.retire(ready[0])
    assert len(b.members(POOL)) == 2
    pool.reconcile()  # deletes the pending pod, not the marked one
    assert pool.deleted == [pool.created[-1]]
    assert sorted(b.members(POOL)) == sorted(ready)


def test_a_dead_pod_is_replaced_by_the_controller_and_membership_follows(api, namespace, pool):
    b = backend(api, namespace)
    dead = b.members(POOL)[0]
    client.CoreV1Api(api).delete_namespaced_pod(dead.removeprefix(f"{POOL}-"), namespace)  # the node died
    assert dead not in b.members(POOL) and len(b.members(POOL)) == 1
    pool.reconcile()
    assert len(b.members(POOL)) == 2 and dead not in b.members(POOL)
    with pytest.raises(BackendError, match="404"):
        b.retire(dead)  # the autoscaler chose it just before it died: an error it logs, no crash
    assert replicas(api, namespace) == 2


def test_a_scale_up_no_pod_answers_is_undone(api, namespace, pool):
    b = backend(api, namespace, start_timeout_s=0.5)  # no controller running: the pod never comes
    with pytest.raises(BackendError, match=rf"scaled to 3 but no new pod .* describe rs -l .*"
                                           rf"astraflow.io/pool={POOL}.*the replicas are put back"):
        b.start(_Node())
    assert replicas(api, namespace) == 2


def test_the_topology_wires_the_backend_and_a_new_one_sees_the_same_pool(api, namespace, pool, kubeconfig, tmp_path):
    """``make_backend`` from a topology (``autoscaler.backend: kubernetes``), as a restarted
    autoscaler would build it: membership comes from the cluster, not from memory."""
    first = backend(api, namespace)
    with pool.running():
        first.start(_Node())
    path = topology(tmp_path, {"enabled": True, "backend": "kubernetes", "kubernetes": {
        "namespace": namespace, "release": RELEASE, "kubeconfig": os.path.relpath(kubeconfig, tmp_path)}})
    again = make_backend(load_plan(path), None, None, tmp_path)
    assert isinstance(again, KubernetesBackend) and again.deployments == {POOL: DEPLOYMENT}
    assert again.members(POOL) == first.members(POOL) and len(again.members(POOL)) == 3
    assert again.retire_all() == [] and replicas(api, namespace) == 3  # the pods are the release's


def test_the_autoscaler_grows_the_pool_to_count_and_releases_it_to_min_through_the_deployment(
        api, namespace, pool, kubeconfig, tmp_path, bootstrap):
    """The autoscaler actor (on the session's real broker) acting through this backend: at start it
    brings the elastic pool to its ``count`` (3) by scaling the Deployment; when the trainer says it
    is done it retires down to ``min`` (1), newest first, and reports the nodes by their pod ids."""
    cfg = load_config(ROOT / "examples" / "arithmetic_grpo.yaml", {"job": f"k8s-{uuid.uuid4().hex[:8]}"})
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    path = topology(tmp_path, {"enabled": True, "backend": "kubernetes", "interval_s": 0.2, "cooldown_s": 0,
                               "kubernetes": {"namespace": namespace, "release": RELEASE,
                                              "kubeconfig": str(kubeconfig), "start_timeout_s": 30}})
    raw = yaml.safe_load(path.read_text())
    raw["regions"]["r"]["pools"][POOL].update(count=3, min=1, max=4)
    path.write_text(yaml.safe_dump(raw))
    plan = load_plan(path, cfg)
    b = make_backend(plan, cfg, None, tmp_path)
    first = b.members(POOL)
    with pool.running(), autoscaler_running(plan, cfg, bootstrap, b) as outcome:
        wait_until(lambda: len(b.members(POOL)) == 3, 60, lambda: f"pool {b.state(POOL)}, {outcome.fatal}")
        assert replicas(api, namespace) == 3
        grown = b.members(POOL)
        with contextlib.closing(Producer(bootstrap, client_id="test")) as producer:
            producer.send(topics.metrics, Metric(f"trainer.{cfg.policy}", "trainer.done", 1.0, 1, time.time(), {}),
                          key=f"trainer.{cfg.policy}", trace=False)
            producer.flush()
        wait_until(lambda: replicas(api, namespace) == 1 and len(pool.pods()) == 1, 60,
                   lambda: f"replicas {replicas(api, namespace)}, pool {b.state(POOL)}, {outcome.fatal}")
    assert b.members(POOL) == grown[:1] and set(first) <= set(grown)
    scaled = [m for _, _, m in read_topic(bootstrap, topics.metrics)
              if isinstance(m, Metric) and m.name == "autoscaler.scaled"]
    assert [m.labels["action"] for m in scaled] == ["down"] and sorted(scaled[0].labels["nodes"]) == sorted(grown[1:])


def test_an_autoscaler_whose_backend_cannot_start_a_node_reports_it_and_goes_on(api, namespace, pool, kubeconfig,
                                                                               tmp_path, bootstrap):
    """No controller answers (the stand-in is not running): the start at setup fails once, is
    reported, the replicas are put back, and the actor goes on to its decisions instead of asking
    again and again for the node it cannot have."""
    cfg = load_config(ROOT / "examples" / "arithmetic_grpo.yaml", {"job": f"k8s-{uuid.uuid4().hex[:8]}"})
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    path = topology(tmp_path, {"enabled": True, "backend": "kubernetes", "interval_s": 0.2,
                               "kubernetes": {"namespace": namespace, "release": RELEASE,
                                              "kubeconfig": str(kubeconfig), "start_timeout_s": 0.5}})
    raw = yaml.safe_load(path.read_text())
    raw["regions"]["r"]["pools"][POOL].update(count=3)
    path.write_text(yaml.safe_dump(raw))
    plan = load_plan(path, cfg)

    def names():
        return [m.name for _, _, m in read_topic(bootstrap, topics.metrics, idle_polls=2) if isinstance(m, Metric)]
    with autoscaler_running(plan, cfg, bootstrap, make_backend(plan, cfg, None, tmp_path)):
        wait_until(lambda: "autoscaler.pool_size" in names(), 60, lambda: f"metrics so far: {sorted(set(names()))}")
    assert names().count("autoscaler.backend_error") == 1 and replicas(api, namespace) == 2


def test_an_unreachable_api_is_a_retriable_backend_error(tmp_path):
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard: nothing listens
    cfg.retries = 0
    b = KubernetesBackend(client.ApiClient(cfg), "ns", {POOL: DEPLOYMENT})
    with pytest.raises(BackendError, match="unreachable") as e:
        b.members(POOL)
    assert e.value.retriable


# --- without a server -----------------------------------------------------------------------------------------

H100 = {"app.kubernetes.io/instance": "myjob", "astraflow.io/pool": "raas-h100"}
PREFIX = "myjob-astraflow-raas-raas-h100-5d8f7c9b6-"


def recorded() -> list[dict]:
    return json.loads(RECORDED.read_text())["items"]


def test_recorded_pods_members_are_live_pods_of_the_pool_oldest_first():
    s = pool_state(recorded(), H100, replicas=4)
    # ready x2 (same second: by name), crash-looping, unschedulable; not: evicted, terminating, the l40 pool's
    assert s.members == [PREFIX + n for n in ("m4zq8", "x7k2p", "b9wtl", "q2ncv")]
    assert s.ready == [PREFIX + "m4zq8", PREFIX + "x7k2p"]
    assert s.leaving == [PREFIX + "h6dxr"]


def test_pods_of_one_second_are_ordered_by_when_they_were_first_listed():
    """creationTimestamp has whole seconds: two pods of one second are ordered by the order the
    backend first listed them (the later one is the newer, the one the autoscaler retires first),
    not by their random names — by name, a node it had just started could sort before the pool's
    own and the autoscaler retire an older one (test_k8s_backend's autoscaler test failed so)."""
    same = [p for p in recorded() if p["metadata"]["name"] in (PREFIX + "m4zq8", PREFIX + "x7k2p")]
    assert same[0]["metadata"]["creationTimestamp"] == same[1]["metadata"]["creationTimestamp"]
    assert pool_state(same, H100, replicas=2).members == [PREFIX + "m4zq8", PREFIX + "x7k2p"]  # by name
    seen = {PREFIX + "x7k2p": 1, PREFIX + "m4zq8": 2}  # m4zq8 came later
    assert pool_state(same, H100, replicas=2, seen=seen).members == [PREFIX + "x7k2p", PREFIX + "m4zq8"]


def test_recorded_pods_a_marked_pod_beyond_the_replicas_is_leaving_within_them_a_member():
    pods = recorded()
    loading = next(p for p in pods if p["metadata"]["name"] == PREFIX + "b9wtl")
    loading["metadata"]["annotations"] = {RETIRED: "2026-11-30T10:40:00+00:00", DELETION_COST: RETIRE_COST}
    assert pool_state(pods, H100, replicas=3).members == [PREFIX + n for n in ("m4zq8", "x7k2p", "q2ncv")]
    assert PREFIX + "b9wtl" in pool_state(pods, H100, replicas=3).leaving
    assert PREFIX + "b9wtl" in pool_state(pods, H100, replicas=4).members


def test_node_ids_of_pods_map_to_their_pool_in_the_plan(tmp_path):
    """Heartbeats of ``<pool>-<pod name>`` count for their pool (device-hours, the autoscaler's demand)."""
    plan = load_plan(topology(tmp_path, {}, pools=("raas", "raas-h100")))
    assert plan.pool_of("raas-h100-" + PREFIX + "x7k2p").name == "raas-h100"  # the longest pool name wins
    assert plan.pool_of("raas-myjob-astraflow-raas-raas-5d8f7c9b6-x7k2p").name == "raas"
    assert plan.pool_of("raas-h100-3").name == "raas-h100" and plan.pool_of("dataflow").name == "dataflow"
    assert plan.pool_of("elsewhere-1") is None


@pytest.mark.parametrize("section, key, problem", [
    ({"backend": "kubernetes"}, "autoscaler", "needs kubernetes"),
    ({"backend": "local", "kubernetes": {"release": "r"}}, "autoscaler", "and only it"),
    ({"backend": "kubernetes", "kubernetes": {"namespace": "rl"}}, "autoscaler.kubernetes", "set release"),
    ({"backend": "kubernetes", "kubernetes": {"release": "r", "deployment": "raas"}}, "autoscaler.kubernetes",
     "must contain {pool}"),
    ({"backend": "kubernetes", "kubernetes": {"release": "r", "namespase": "rl"}}, "autoscaler.kubernetes.namespase",
     "unknown key"),
])
def test_a_bad_kubernetes_section_names_the_key_and_the_file(tmp_path, section, key, problem):
    path = topology(tmp_path, {"enabled": True, **section})
    with pytest.raises(TopologyError) as e:
        load_plan(path)
    assert e.value.file == str(path) and e.value.key == key and problem in e.value.problem


def test_a_missing_kubeconfig_names_the_key_and_the_file(tmp_path):
    path = topology(tmp_path, {"enabled": True, "backend": "kubernetes",
                               "kubernetes": {"release": "r", "kubeconfig": "nowhere/config"}})
    with pytest.raises(TopologyError, match=r"topology\.yaml: autoscaler\.kubernetes\.kubeconfig: .*nowhere/config"):
        make_backend(load_plan(path), None, None, tmp_path)
