"""The autoscaler's Kubernetes backend: a RaaS pool is the Helm chart's Deployment for it.

A pool's Deployment is named by ``autoscaler.kubernetes.deployment`` (the chart's
``<release>-astraflow-raas-<pool>``); its pods are the pool's nodes, found with the
Deployment's own label selector. **Node ids** are ``<pool>-<pod name>``: the chart starts
each RaaS container with ``--node-id "<pool>-$POD_NAME"``, so the id a node heartbeats
under is the id this backend lists, retires and counts device-hours for (the plan maps
it to its pool by the ``<pool>-`` prefix). The ids the autoscaler plans (``<pool>-<i>``)
are not used: the ReplicaSet controller names the pods.

* **Scale up** (:meth:`KubernetesBackend.start`): the Deployment's ``scale`` subresource
  is patched to one more replica (conditional on the ``resourceVersion`` read, retried on
  a conflict); the call returns once the controller has created the new pod (any phase:
  it may still be pulling its image or loading its model), or raises
  :class:`~.backends.BackendError` after ``start_timeout_s`` and puts the replicas back.
* **Retire** (:meth:`KubernetesBackend.retire`): the chosen pod is annotated with the
  lowest ``controller.kubernetes.io/pod-deletion-cost`` and ``astraflow.io/retired``, then
  the replicas go down by one. The ReplicaSet controller deletes the cheapest pod, the
  kubelet sends it SIGTERM and waits its ``terminationGracePeriodSeconds``: the node
  finishes its transaction and leaves the consumer group. (The controller prefers a pod
  that is pending or not ready over any cost; if it removes such a pod instead, the
  marked one simply stays a member — see :func:`pool_state`.)
* **Membership** (:func:`pool_state`) is read from the pods every time, never kept here,
  so a restarted autoscaler sees exactly what the cluster runs: a pod the controller
  created and has not been told to delete is a member, ready or not (counting only ready
  pods would make the autoscaler ask again for pods that are loading their model).
  Pods being deleted, failed or finished pods, and marked pods the replica count already
  leaves out are not members. :attr:`PoolState.ready` is the subset serving now.

:meth:`KubernetesBackend.retire_all` leaves the pools as they are: their pods belong to
the Deployment (the Helm release), not to this process, and a restarted autoscaler takes
them over; ``helm uninstall`` or ``kubectl scale`` ends them. The ``kubernetes`` client
appears only in this module. It knows nothing about Kafka, the scaling rule or what a
node runs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from .backends import Backend, BackendError
from .plan import NodePlan
from .schema import TopologyError

__all__ = ["DELETION_COST", "KubernetesBackend", "PoolState", "RETIRED", "RETIRE_COST", "api_client", "pool_state"]

log = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
RETIRE_COST = str(-(2**31))  #: the annotation is an int32; the lowest makes the pod the first deleted
RETIRED = "astraflow.io/retired"  #: when the autoscaler chose the pod for retirement (ISO time)
MERGE = "application/merge-patch+json"  # the client would send a dict body as a JSON patch otherwise
CONFLICT_TRIES = 5


class PoolState(NamedTuple):
    """A pool as its Deployment and pods say it is."""

    replicas: int
    """the Deployment's desired replicas"""
    members: list[str]
    """pod names of its nodes, oldest first (the autoscaler retires the last)"""
    ready: list[str]
    """the members that are Running and Ready"""
    leaving: list[str]
    """pods being deleted, or marked for retirement and beyond the replica count"""


def selector_string(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def pool_state(pods: Sequence[dict], match_labels: dict[str, str], replicas: int,
               seen: Mapping[str, int] | None = None) -> PoolState:
    """Membership from pod objects as the API returns them (``kubectl get pods -o json``'s items).

    Pods that do not carry ``match_labels`` are ignored. Live pods (not being deleted, phase
    neither ``Succeeded`` nor ``Failed``) are members, oldest first, except marked ones
    (``astraflow.io/retired``) up to the number of live pods beyond ``replicas``: those the
    controller is about to delete. Age is ``creationTimestamp``, which has whole seconds: pods of
    the same second are ordered by ``seen`` (pod name -> when the caller first listed it; a pod
    created after another is listed after it), then by name.
    """
    seen = seen or {}
    mine = [p for p in pods if all((_meta(p).get("labels") or {}).get(k) == v for k, v in match_labels.items())]
    live = sorted((p for p in mine if not _meta(p).get("deletionTimestamp")
                   and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")),
                  key=lambda p: (_meta(p).get("creationTimestamp", ""), seen.get(_meta(p)["name"], 0),
                                 _meta(p)["name"]))
    excess = max(0, len(live) - replicas)
    marked = [p for p in reversed(live) if RETIRED in (_meta(p).get("annotations") or {})][:excess]
    members = [p for p in live if p not in marked]
    leaving = [_meta(p)["name"] for p in mine if _meta(p).get("deletionTimestamp")] + [_meta(p)["name"] for p in marked]
    return PoolState(replicas, [_meta(p)["name"] for p in members],
                     [_meta(p)["name"] for p in members if _ready(p)], sorted(leaving))


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def api_client(kubeconfig: str | None, context: str | None, source: str = "<topology>") -> client.ApiClient:
    """A client for the cluster: ``kubeconfig`` (and ``context``) when given; else the pod's service
    account when running in one (``KUBERNETES_SERVICE_HOST``); else ``$KUBECONFIG`` or ``~/.kube/config``."""
    cfg = client.Configuration()
    in_cluster = kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST")
    where = "the pod's service account" if in_cluster else (kubeconfig or "$KUBECONFIG or ~/.kube/config")
    key = "autoscaler.kubernetes." + ("context" if context and not kubeconfig else "kubeconfig")
    if kubeconfig and not Path(kubeconfig).is_file():
        raise TopologyError(source, key, f"{kubeconfig}: no such file")
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (config.ConfigException, OSError) as e:
        raise TopologyError(source, key, f"no usable Kubernetes client configuration in {where}: {e}") from None
    return client.ApiClient(cfg)


class KubernetesBackend(Backend):
    """Scales each pool's Deployment through the API; membership from its pods (module docstring)."""

    def __init__(self, api: client.ApiClient, namespace: str, deployments: dict[str, str],
                 start_timeout_s: float = 120.0, poll_s: float = 0.5) -> None:
        """``deployments``: pool -> the name of its Deployment in ``namespace``."""
        super().__init__()
        self.apps, self.core = client.AppsV1Api(api), client.CoreV1Api(api)
        self.namespace, self.deployments = namespace, dict(deployments)
        self.start_timeout_s, self.poll_s = start_timeout_s, poll_s
        self._selectors: dict[str, dict[str, str]] = {}
        self._seen: dict[str, int] = {}  #: pod name -> the order this backend first listed it in (age within a second)

    @classmethod
    def from_spec(cls, spec: dict, pools: Sequence[str], source: str) -> "KubernetesBackend":
        """From the topology's ``autoscaler.kubernetes`` section (a kubeconfig path relative to its file)."""
        kubeconfig = spec.get("kubeconfig")
        if kubeconfig is not None:
            kubeconfig = str(Path(source).parent / Path(kubeconfig).expanduser())
        names = {p: spec["deployment"].format(pool=p, release=spec.get("release") or "") for p in pools}
        return cls(api_client(kubeconfig, spec.get("context"), source), spec["namespace"], names,
                   start_timeout_s=spec["start_timeout_s"])

    # --- membership ---------------------------------------------------------------------------

    def state(self, pool: str) -> PoolState:
        """The pool as the cluster has it now (two API reads)."""
        replicas = self._scale(pool)[0]
        return pool_state(self._pods(pool), self._selector(pool), replicas, self._seen)

    def members(self, pool: str) -> list[str]:
        return [f"{pool}-{name}" for name in self.state(pool).members]

    def ready(self, pool: str) -> list[str]:
        return [f"{pool}-{name}" for name in self.state(pool).ready]

    # --- actions ------------------------------------------------------------------------------

    def start(self, node: NodePlan) -> None:
        pool = node.pool
        before = {_meta(p)["name"] for p in self._pods(pool)}
        replicas = self._add_replicas(pool, +1)
        with self._lock:
            self._next[pool] = self._next.get(pool, 0) + 1
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            new = [n for n in pool_state(self._pods(pool), self._selector(pool), replicas, self._seen).members
                   if n not in before]
            if new:
                log.info("scaled %s to %d replicas: new node %s-%s", self._name(pool), replicas, pool, new[0])
                return
            time.sleep(self.poll_s)
        try:
            self._add_replicas(pool, -1)
            undone = "the replicas are put back"
        except BackendError as e:
            undone = f"putting the replicas back failed too ({e})"
        raise BackendError(f"start {pool}: Deployment {self.namespace}/{self._name(pool)} scaled to {replicas} "
                           f"but no new pod within {self.start_timeout_s:g}s (a quota, an admission webhook, a "
                           f"missing service account? `kubectl -n {self.namespace} describe rs -l "
                           f"{selector_string(self._selector(pool))}`); {undone}")

    def retire(self, node_id: str) -> None:
        pool = self._pool_of(node_id)
        pod = node_id[len(pool) + 1:]
        mark = {"metadata": {"annotations": {DELETION_COST: RETIRE_COST,
                                             RETIRED: datetime.now(timezone.utc).isoformat(timespec="seconds")}}}
        self._call(f"retire {node_id}: mark pod {pod}", self.core.patch_namespaced_pod, pod, self.namespace, mark,
                   _content_type=MERGE)
        try:
            replicas = self._add_replicas(pool, -1)
        except BackendError:
            unmark = {"metadata": {"annotations": {DELETION_COST: None, RETIRED: None}}}
            try:
                self._call(f"retire {node_id}: unmark pod {pod}", self.core.patch_namespaced_pod, pod, self.namespace,
                           unmark, _content_type=MERGE)
            except BackendError as e:
                log.error("%s", e)
            raise
        log.info("retiring %s: %s scaled to %d, its pod %s marked the first to delete", node_id,
                 self._name(pool), replicas, pod)

    def retire_all(self) -> list[str]:
        """Nothing: the pods are the Deployment's and outlive this process (module docstring)."""
        return []

    # --- the API ------------------------------------------------------------------------------

    def _name(self, pool: str) -> str:
        try:
            return self.deployments[pool]
        except KeyError:
            raise KeyError(f"{pool} is not a pool of this backend (pools: {', '.join(self.deployments)})") from None

    def _pool_of(self, node_id: str) -> str:
        for pool in sorted(self.deployments, key=len, reverse=True):
            if node_id.startswith(pool + "-"):
                return pool
        raise KeyError(f"{node_id} is not a node id of this backend (<pool>-<pod name>, pools: "
                       f"{', '.join(self.deployments)})")

    def _call(self, what: str, fn, *args, **kwargs) -> Any:
        """One API call; its JSON body (``None`` when empty). Errors become :class:`BackendError`."""
        try:
            resp = fn(*args, _preload_content=False, **kwargs)
        except ApiException as e:
            err = BackendError(f"{what}: the API answered {e.status} {e.reason}: {_message(e)}")
            err.status = e.status  # type: ignore[attr-defined]
            raise err from None
        except (HTTPError, OSError) as e:
            raise BackendError(f"{what}: the Kubernetes API is unreachable: {e}") from None
        return json.loads(resp.data) if resp.data else None

    def _selector(self, pool: str) -> dict[str, str]:
        if pool not in self._selectors:
            dep = self._call(f"read Deployment {self.namespace}/{self._name(pool)}",
                             self.apps.read_namespaced_deployment, self._name(pool), self.namespace)
            labels = ((dep.get("spec") or {}).get("selector") or {}).get("matchLabels")
            if not labels:
                raise BackendError(f"Deployment {self.namespace}/{self._name(pool)} has no spec.selector.matchLabels "
                                   f"(the chart's RaaS Deployments select their pods by matchLabels)")
            self._selectors[pool] = dict(labels)
        return self._selectors[pool]

    def _pods(self, pool: str) -> list[dict]:
        body = self._call(f"list the pods of {self.namespace}/{self._name(pool)}", self.core.list_namespaced_pod,
                          self.namespace, label_selector=selector_string(self._selector(pool)))
        items = (body or {}).get("items") or []
        with self._lock:  # pods of one second are ordered by when this backend first listed them
            for p in items:
                self._seen.setdefault(_meta(p).get("name", ""), len(self._seen) + 1)
        return items

    def _scale(self, pool: str) -> tuple[int, str]:
        body = self._call(f"read the scale of Deployment {self.namespace}/{self._name(pool)}",
                          self.apps.read_namespaced_deployment_scale, self._name(pool), self.namespace)
        return int((body.get("spec") or {}).get("replicas") or 0), _meta(body).get("resourceVersion", "")

    def _add_replicas(self, pool: str, delta: int) -> int:
        """Replicas += delta, conditional on the version read (another writer in between: read again)."""
        for _ in range(CONFLICT_TRIES):
            replicas, version = self._scale(pool)
            target = max(0, replicas + delta)
            patch = {"metadata": {"resourceVersion": version}, "spec": {"replicas": target}}
            try:
                self._call(f"scale Deployment {self.namespace}/{self._name(pool)} to {target}",
                           self.apps.patch_namespaced_deployment_scale, self._name(pool), self.namespace, patch,
                           _content_type=MERGE)
                return target
            except BackendError as e:
                if getattr(e, "status", None) != 409:
                    raise
        raise BackendError(f"scale Deployment {self.namespace}/{self._name(pool)}: {CONFLICT_TRIES} conflicting "
                           f"updates in a row (another writer: `helm upgrade`, an HPA?)")


def _message(e: ApiException) -> str:
    try:
        return json.loads(e.body).get("message") or e.body
    except (TypeError, ValueError):
        return str(e.body or "no body").strip()
