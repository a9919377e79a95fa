"""Tracking: the job's metrics in TensorBoard and MLflow, and ``astraflow track``.

A :class:`MetricSink` takes the ``metrics`` topic's :class:`~astraflow.topics.Metric` records
one at a time (``write``) and flushes what it holds on ``close``. Two are built in, each on
its library's own writer: :class:`TensorBoardSink` (event files, through torch's
``SummaryWriter``) and :class:`MlflowSink` (one MLflow run, through ``MlflowClient``; a
local file store by default). :func:`open_sinks` builds those a job config's ``tracking``
section asks for, as one :class:`Sinks`. The launcher feeds it every record it reads from
``metrics``; :func:`track` does the same in a process of its own (``astraflow track``), for
a job no launcher follows (``astraflow node --topology``) or a run read again afterwards.

Every metric is one scalar: its :func:`tag` is ``<component>/<name>``, with ``/<policy>``
after it when the metric carries a ``policy`` label; its step is the metric's ``step`` and
its time the metric's ``ts``.

It knows nothing of what the metrics mean beyond the end of a job (every trainer's
``trainer.done``, then the final ``eval.accuracy``), nor of processes. The libraries are
imported when a sink opens, so a job that tracks nothing never loads them.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from astraflow.errors import FatalError
from astraflow.topics import security

if TYPE_CHECKING:
    from astraflow.config import TrackingConfig
    from astraflow.topics import Metric

__all__ = ["MetricSink", "MlflowSink", "PassedOver", "Sinks", "TensorBoardSink", "TrackError", "TrackResult", "job_policies_at",
           "open_sinks", "tag", "track"]

log = logging.getLogger(__name__)


class TrackError(FatalError):
    """``astraflow track`` cannot follow the job (no such job on the cluster, nothing to write to)."""


class MetricSink(Protocol):
    """Where metrics go: one ``write`` per record, in the order the topic holds them."""

    def write(self, metric: Metric) -> None: ...

    def close(self) -> None:
        """Flush everything written and release the files; the sink is not used after it."""


def tag(metric: Metric) -> str:
    """The scalar's name: ``<component>/<name>``, plus ``/<policy>`` where the metric has that label."""
    policy = metric.labels.get("policy")
    return f"{metric.component}/{metric.name}" + (f"/{policy}" if policy not in (None, "") else "")


class TensorBoardSink:
    """TensorBoard event files in ``log_dir`` (``tensorboard --logdir`` on it or a folder above)."""

    def __init__(self, log_dir: str | Path, flush_s: float = 10.0) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(str(self.log_dir), flush_secs=max(1, round(flush_s)))

    def write(self, metric: Metric) -> None:
        self._writer.add_scalar(tag(metric), metric.value, metric.step, walltime=metric.ts or None)

    def close(self) -> None:
        self._writer.close()

    def __str__(self) -> str:
        return f"tensorboard: {self.log_dir} (tensorboard --logdir {self.log_dir})"


#: What MLflow accepts in a metric key; anything else becomes "_".
_MLFLOW_KEY = re.compile(r"[^\w.\- /]")


def _is_local(uri: str) -> bool:
    return uri.startswith("file:") or "://" not in uri and not uri.startswith(("sqlite:", "databricks"))


class MlflowSink:
    """One MLflow run, in ``experiment`` (made if missing) at the tracking URI ``uri``.

    Metrics are sent in batches (every ``flush_every`` records or ``flush_s`` seconds, and on
    ``close``, which also marks the run finished). A local file store is what MLflow 3 keeps
    in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``: for such a URI the sink sets it
    (unless already set), as ``mlflow ui`` needs it too on the same directory."""

    def __init__(self, uri: str, experiment: str, run_name: str, tags: dict[str, str] | None = None,
                 flush_every: int = 500, flush_s: float = 5.0) -> None:
        if _is_local(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric as MlflowMetric
        from mlflow.tracking import MlflowClient
        self._metric = MlflowMetric
        self.uri, self.flush_every, self.flush_s = uri, flush_every, flush_s
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None and found.lifecycle_stage != "active":
            raise TrackError(f"MLflow experiment {experiment!r} at {uri} is deleted; restore it (mlflow "
                             "experiments restore) or set tracking.experiment to another name")
        self.experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags or {}).info.run_id
        self._pending: list = []
        self._last_flush = time.monotonic()

    def write(self, metric: Metric) -> None:
        ts = metric.ts or time.time()
        self._pending.append(self._metric(_MLFLOW_KEY.sub("_", tag(metric)), metric.value, int(ts * 1000),
                                          metric.step))
        if len(self._pending) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        while self._pending:  # MLflow takes at most 1000 metrics a batch
            batch, self._pending = self._pending[:1000], self._pending[1000:]
            self.client.log_batch(self.run_id, metrics=batch)
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
        self.client.set_terminated(self.run_id, "FINISHED")

    def __str__(self) -> str:
        return f"mlflow: run {self.run_id} in {self.uri}"


@dataclass
class Sinks:
    """The sinks a job tracks to, fed together: a :class:`MetricSink` itself, whose ``write``
    passes over anything but a ``Metric`` (the launcher's feed also reads ``control``)."""

    sinks: list[MetricSink] = field(default_factory=list)
    written: int = 0

    def write(self, metric) -> None:
        from astraflow.topics import Metric
        if not self.sinks or not isinstance(metric, Metric):
            return
        for s in self.sinks:
            s.write(metric)
        self.written += 1

    def close(self) -> None:
        """Close every sink; the first error, if any, is raised once all were closed."""
        error = None
        for s in self.sinks:
            try:
                s.close()
            except Exception as e:  # noqa: BLE001 - the others still flush
                error = error or e
        self.sinks = []
        if error is not None:
            raise error

    def __enter__(self) -> Sinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def where(self) -> list[str]:
        """One line per sink: where it writes (what the launcher and ``track`` print)."""
        return [str(s) for s in self.sinks]


def open_sinks(tracking: TrackingConfig, run_dir: str | Path, job: str, source: str = "astraflow run") -> Sinks:
    """The sinks ``tracking`` asks for, writing under ``run_dir`` (``tensorboard/``, ``mlruns/``)."""
    run_dir = Path(run_dir)
    sinks: list[MetricSink] = []
    try:
        if tracking.tensorboard:
            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        if tracking.mlflow:
            uri = (run_dir / "mlruns").resolve().as_uri() if tracking.mlflow is True else tracking.mlflow
            sinks.append(MlflowSink(uri, tracking.experiment or job, tracking.run_name or run_dir.name,
                                    tags={"astraflow.job": job, "astraflow.run_dir": str(run_dir.resolve()),
                                          "astraflow.source": source}))
    except BaseException:
        Sinks(sinks).close()
        raise
    return Sinks(sinks)


@dataclass
class TrackResult:
    """What :func:`track` read: records written to the sinks, records passed over as
    undecodable, and why it stopped (``done``, ``idle``, ``stopped``)."""

    written: int = 0
    skipped: int = 0
    reason: str = ""
    done: dict[str, int] = field(default_factory=dict)  #: policy -> the version its trainer finished at


class PassedOver:
    """Stands where a consumer's dead-letter topic would for a reader that only reads
    (``track``, the dashboard): an undecodable record is named (its coordinates) and passed
    over; it stays in the log."""

    def __init__(self, say: Callable[[str], None], reader: str = "track") -> None:
        self.say, self.reader, self.count = say, reader, 0

    def put(self, topic, partition, offset, key, value, headers, error) -> None:
        self.count += 1
        self.say(f"{self.reader}: passed over {topic}[{partition}]@{offset}: {error}")


def job_policies_at(bootstrap: str, job: str) -> tuple[str, ...]:
    """The policies of ``job`` on the cluster (its ``tasks.<policy>`` topics); :class:`TrackError`
    when the job has no ``metrics`` topic there."""

    from astraflow.status import job_policies
    from astraflow.topics import JobTopics
    admin = security.admin(bootstrap_servers=bootstrap, client_id="astraflow-track")
    try:
        names = set(admin.list_topics())
    finally:
        admin.close()
    if JobTopics(job=job).metrics not in names:
        raise TrackError(f"no job {job!r} at {bootstrap}: it has no {JobTopics(job=job).metrics} topic (start "
                         "track once the job's topics exist)")
    return job_policies(names, job)


def track(bootstrap: str, job: str, sinks: Sinks, *, policies: tuple[str, ...] | None = None,
          from_now: bool = False, until_idle: float | None = None, settle_s: float = 60.0,
          stop: Callable[[], bool] = lambda: False, say: Callable[[str], None] = print) -> TrackResult:
    """Feed ``sinks`` from job ``job``'s ``metrics`` topic (from its beginning, or ``from_now``)
    until the job is done (the trainer of every policy in ``policies``, by default the job's
    on the cluster, reported ``trainer.done``, and the final evaluation arrived or ``settle_s``
    passed without it), ``until_idle`` seconds went by without a record, or ``stop()`` says so
    (a signal)."""
    from astraflow.topics import Consumer, JobTopics, Metric, TopicPartition

    topics = JobTopics(job=job)
    if policies is None:
        policies = job_policies_at(bootstrap, job)
    passed = PassedOver(say)
    tp = TopicPartition(topics.metrics, 0)
    result = TrackResult()
    with Consumer(bootstrap, partitions=[tp], client_id="astraflow-track", dead_letters=passed,  # type: ignore[arg-type]
                  expect={topics.metrics: (Metric,)}) as consumer:
        if from_now:
            consumer.seek_to_end(tp)
        else:
            consumer.seek_to_beginning(tp)
        last = time.monotonic()
        all_done_at: float | None = None  # when every trainer had reported done
        final_eval, eval_step = False, -1
        while True:
            for d in consumer.poll(500):
                m, last = d.message, time.monotonic()
                sinks.write(m)
                result.written += 1
                if m.name == "trainer.done" and m.component.startswith("trainer."):
                    result.done[m.component.split(".", 1)[1]] = m.step
                elif m.name == "eval.accuracy":
                    eval_step = max(eval_step, m.step)
                    final_eval = final_eval or all_done_at is not None  # an evaluation after the trainers' end
                if all_done_at is None and policies and all(p in result.done for p in policies):
                    all_done_at = time.monotonic()
                    # the final version's evaluation can land before its trainer's done
                    final_eval = eval_step >= max(result.done.values())
            now = time.monotonic()
            if all_done_at is not None and (final_eval or now - all_done_at >= settle_s):
                result.reason = "done"
                break
            if until_idle is not None and now - last >= until_idle:
                result.reason = "idle"
                break
            if stop():
                result.reason = "stopped"
                break
    result.skipped = passed.count
    return result
