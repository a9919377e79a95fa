"""The Helm chart (``deploy/helm/astraflow``) for two topologies: ``astraflow k8s render`` writes
the values, ``helm lint`` and ``helm template`` (a real helm, built by ``make helm``) render the
objects, and the objects are checked — a RaaS pool's replicas and GPUs, the trainer's rank
group, the Secret mounted and its password in no ConfigMap, Strimzi's topics and users. No
Kubernetes API server is involved: this is what the chart would create, not a cluster running it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from astraflow.config import ConfigError
from astraflow.k8s_values import K8sRenderError, render_values

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "astraflow"
HELM = Path(os.environ.get("ASTRAFLOW_HELM", ROOT / ".tools" / "bin" / "helm"))
PASSWORD = "s3cret-test-password"


def helm(*args: str) -> str:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: `make helm` builds it (make test does), or set ASTRAFLOW_HELM")
    env = {**os.environ, "HELM_CACHE_HOME": "/nonexistent-cache", "HELM_CONFIG_HOME": "/nonexistent-config"}
    out = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def render(tmp_path, values: dict, *sets: str) -> list[dict]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    helm("lint", str(CHART), "-f", str(path), *sets)
    text = helm("template", "rel", str(CHART), "-f", str(path), *sets)
    return [d for d in yaml.safe_load_all(text) if d]


def objects(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(obj) -> dict:
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def sasl_job(tmp_path) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text())
    data["kafka"] = {"security": {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                                  "username": "af", "password_env": "AF_KAFKA_PASSWORD"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_three_hosts_on_an_existing_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("AF_KAFKA_PASSWORD", PASSWORD)  # the job loads; the values never read it
    job = sasl_job(tmp_path)
    values = render_values(ROOT / "examples" / "topology_three_hosts.yaml", job)
    assert PASSWORD not in yaml.safe_dump(values) and values["secrets"]["env"] == {"AF_KAFKA_PASSWORD": ""}
    docs = render(tmp_path, values, "--set", f"secrets.env.AF_KAFKA_PASSWORD={PASSWORD}")
    deployments = objects(docs, "Deployment")
    h100, l40 = deployments["rel-astraflow-raas-raas-h100"], deployments["rel-astraflow-raas-raas-l40"]
    assert h100["spec"]["replicas"] == 2 and l40["spec"]["replicas"] == 2
    assert l40["metadata"]["annotations"] == {"astraflow.io/min": "1", "astraflow.io/max": "6"}
    assert container(h100)["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert "--role raas --policy policy --node-id \"raas-h100-$POD_NAME\"" in container(h100)["args"][0]
    assert "--bootstrap-servers \"$AF_BOOTSTRAP\"" in container(h100)["args"][0]
    (trainer,) = objects(docs, "StatefulSet").values()
    assert trainer["spec"]["replicas"] == 1 and container(trainer)["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert "--nnodes" not in container(trainer)["args"][0]  # one host: no rendezvous across pods
    # the job config in a ConfigMap, the password only in the Secret, handed to every component
    (cm,) = objects(docs, "ConfigMap").values()
    assert cm["data"]["job.yaml"] == job.read_text()
    assert not any(PASSWORD in yaml.safe_dump(d) for d in docs if d["kind"] == "ConfigMap")
    (secret,) = objects(docs, "Secret").values()
    assert secret["stringData"] == {"AF_KAFKA_PASSWORD": PASSWORD}
    components = [*deployments.values(), trainer]
    assert len(components) == 4  # dataflow, two pools, trainer
    for obj in components:
        env = {e["name"]: e for e in container(obj)["env"]}
        assert env["AF_KAFKA_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"],
                                                                          "key": "AF_KAFKA_PASSWORD"}
        assert env["AF_BOOTSTRAP"]["value"] == "10.0.0.1:9092"
        volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}
        assert volumes["secrets"]["secret"]["secretName"] == secret["metadata"]["name"]
        assert {"name": "secrets", "mountPath": "/etc/astraflow/secrets", "readOnly": True} in \
            container(obj)["volumeMounts"]


def test_a_two_host_trainer_and_a_strimzi_cluster(tmp_path):
    topo = {"name": "k8s-two-host-trainer",
            "regions": {"dc": {"kafka": "embedded", "hosts": ["t0", "t1", "r0"],
                               "pools": {"dataflow": {"component": "dataflow", "hosts": ["t0"]},
                                         "trainer": {"component": "trainer", "hosts": ["t0", "t1"], "count": 2,
                                                     "master_port": 29600, "device": {"kind": "h100", "count": 4}},
                                         "raas": {"component": "raas", "hosts": ["r0"], "count": 3, "min": 1,
                                                  "max": 5, "device": {"kind": "h100", "count": 1}}}}}}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    with pytest.raises(K8sRenderError, match="'embedded' is a broker"):
        render_values(path, ROOT / "examples" / "arithmetic_grpo.yaml")
    values = render_values(path, ROOT / "examples" / "arithmetic_grpo.yaml", {"trainer.ranks": 4}, strimzi=True)
    docs = render(tmp_path, values)
    (trainer,) = objects(docs, "StatefulSet").values()
    assert trainer["spec"]["replicas"] == 2 and trainer["spec"]["podManagementPolicy"] == "Parallel"
    args = container(trainer)["args"][0]
    name = trainer["metadata"]["name"]
    assert "--set trainer.ranks=4 --nnodes 2 --node-rank \"${POD_NAME##*-}\"" in args
    assert f"--master-addr {name}-0.{name} --master-port 29600" in args
    (service,) = objects(docs, "Service").values()
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == name
    assert objects(docs, "Deployment")["rel-astraflow-raas-raas"]["spec"]["replicas"] == 3
    # Strimzi: the cluster, every topic of the job, one user per principal with its ACLs
    assert list(objects(docs, "Kafka")) == ["astraflow"]
    topics = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    from astraflow.config import load_config
    from astraflow.topics import job_topics
    specs = job_topics(load_config(ROOT / "examples" / "arithmetic_grpo.yaml")).specs()
    assert set(topics) == {s.name for s in specs}
    assert all(topics[s.name]["partitions"] == s.partitions for s in specs)
    users = objects(docs, "KafkaUser")
    assert {"af-raas", "af-trainer", "af-dataflow"} <= set(users)
    raas_acls = users["af-raas"]["spec"]["authorization"]["acls"]
    assert {"resource": {"type": "transactionalId", "name": "af.arithmetic-grpo.raas.", "patternType": "prefix"},
            "operations": ["Write"], "host": "*"} in raas_acls
    assert {"resource": {"type": "topic", "name": "af.arithmetic-grpo.trajectories", "patternType": "literal"},
            "operations": ["Write"], "host": "*"} in raas_acls
    # a RaaS node may not write what only the trainer writes
    assert not any(a["resource"].get("name") == "af.arithmetic-grpo.weights.policy" and a["operations"] == ["Write"]
                   for a in raas_acls)
    env = {e["name"]: e for e in container(trainer)["env"]}
    assert env["AF_BOOTSTRAP"]["value"] == "astraflow-kafka-bootstrap:9092"


def test_what_a_release_cannot_run_is_refused():
    with pytest.raises(K8sRenderError, match="regions with a Kafka cluster of their own"):
        render_values(ROOT / "examples" / "topology_two_regions_existing.yaml", ROOT / "examples" / "arithmetic_grpo.yaml")


def elastic_topology(tmp_path, host: str = "ctl") -> Path:
    kubernetes = {"namespace": "mine", "release": "other", "kubeconfig": "kube/config", "start_timeout_s": 60}
    topo = {"name": "k8s-elastic",
            "autoscaler": {"enabled": True, "host": host, "backend": "kubernetes", "cooldown_s": 120,
                           "kubernetes": kubernetes},
            "regions": {"dc": {"kafka": "kafka.example:9092", "hosts": ["ctl", "t0", "r0"],
                               "pools": {"dataflow": {"component": "dataflow", "hosts": ["t0"]},
                                         "trainer": {"component": "trainer", "hosts": ["t0"]},
                                         "raas": {"component": "raas", "hosts": ["r0"], "count": 2, "min": 1,
                                                  "max": 5}}}}}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def test_the_autoscaler_pod_scales_this_releases_deployments_with_a_role_for_exactly_that(tmp_path):
    from astraflow.topology.launch import load_plan
    job = ROOT / "examples" / "arithmetic_grpo.yaml"
    with pytest.raises(ConfigError, match=r"trainer\.signing_key: this topology runs on 2 hosts"):
        render_values(elastic_topology(tmp_path), job)  # `node --topology` in its pod would refuse it
    unsigned = {"trainer.require_signatures": False, "rollout.require_signatures": False}
    values = render_values(elastic_topology(tmp_path), job, unsigned)
    assert values["autoscaler"]["enabled"] and values["autoscaler"]["host"] == "ctl"
    docs = render(tmp_path, values)
    name = "rel-astraflow-autoscaler"
    (role,) = objects(docs, "Role").values()
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
                             {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
                             {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}]
    (binding,) = objects(docs, "RoleBinding").values()
    assert binding["roleRef"]["name"] == name and binding["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": "default"}]
    assert list(objects(docs, "ServiceAccount")) == [name]
    scaler = objects(docs, "Deployment")[name]
    assert scaler["spec"]["template"]["spec"]["serviceAccountName"] == name and scaler["spec"]["replicas"] == 1
    assert container(scaler)["args"][0].endswith("--topology /etc/astraflow/job/topology.yaml --host ctl")
    # the topology it reads names this release's Deployments in this namespace, in-cluster credentials
    (cm,) = objects(docs, "ConfigMap").values()
    path = tmp_path / "in-pod-topology.yaml"
    path.write_text(cm["data"]["topology.yaml"])
    a = load_plan(path).autoscaler
    assert a["backend"] == "kubernetes" and a["cooldown_s"] == 120
    assert a["kubernetes"] == {"namespace": "default", "release": "rel", "deployment": "rel-astraflow-raas-{pool}",
                               "kubeconfig": None, "context": None, "start_timeout_s": 60}
    assert a["kubernetes"]["deployment"].format(pool="raas") in objects(docs, "Deployment")


def test_the_autoscaler_pod_is_only_for_the_kubernetes_backend_on_a_host_without_pools(tmp_path):
    with pytest.raises(K8sRenderError, match=r"autoscaler\.host: t0 holds nodes \(dataflow, trainer\)"):
        render_values(elastic_topology(tmp_path, host="t0"), ROOT / "examples" / "arithmetic_grpo.yaml",
                      {"trainer.require_signatures": False, "rollout.require_signatures": False})
    # the command backend starts processes, which a release does not: its pools keep their replicas
    values = render_values(ROOT / "examples" / "topology_three_hosts.yaml", ROOT / "examples" / "arithmetic_grpo.yaml")
    assert values["autoscaler"] == {"enabled": False}
    docs = render(tmp_path, values)
    assert not objects(docs, "Role") and "rel-astraflow-autoscaler" not in objects(docs, "Deployment")
