"""Process telemetry: the OpenTelemetry tracer provider and the metrics emitter.

Spans go to an OTLP endpoint when the job config names one, else to a JSONL file per
process in the run directory (one span per line, OpenTelemetry's own JSON shape).
Metrics are :class:`~astraflow.topics.Metric` records on the job's ``metrics`` topic,
which feeds ``astraflow status``, the progress bars and the run's CSV/plot.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from astraflow.topics import Metric, Producer


class JsonlSpanExporter(SpanExporter):
    """Appends finished spans to a file, one compact JSON object per line."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(json.loads(s.to_json(indent=None)), separators=(",", ":")) for s in spans]
        with self._lock, open(self.path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def setup_tracing(service: str, run_dir: str | os.PathLike | None, otlp_endpoint: str | None = None,
                  otlp_protocol: str = "http") -> TracerProvider:
    """Install a global tracer provider for this process and return it (call ``shutdown`` at exit)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service,
                                                        "process.pid": os.getpid()}))
    if otlp_endpoint:
        if otlp_protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter: SpanExporter = OTLPSpanExporter(endpoint=otlp_endpoint)
    else:
        path = Path(run_dir or ".") / "traces" / f"{service}-{os.getpid()}.jsonl"
        exporter = JsonlSpanExporter(path)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    return provider


class MetricsEmitter:
    """Sends metrics to the ``metrics`` topic; fire-and-forget, flushed on close."""

    def __init__(self, producer: Producer, topic: str, component: str) -> None:
        self.producer, self.topic, self.component = producer, topic, component

    def emit(self, name: str, value: float, step: int = 0, **labels: Any) -> None:
        self.producer.send(self.topic, Metric(self.component, name, float(value), step, time.time(), labels),
                           key=self.component, trace=False)

    def emit_many(self, values: dict[str, float], step: int = 0, **labels: Any) -> None:
        for name, value in values.items():
            self.emit(name, value, step, **labels)

    def emit_device(self, engine: Any, step: int = 0, **labels: Any) -> None:
        """An emulated engine's device totals so far (``emulated.<call>.modelled_s``, ``held_s``,
        ``cpu_fraction``, ``calls``: modelled seconds, labelled with the profile); nothing for
        an engine on its real device."""
        device = getattr(engine, "device", None)
        summary = device.summary() if hasattr(device, "summary") else None
        if not summary:
            return
        for call, s in summary.items():
            if call == "share":  # devices taken in turns: claims, yields and their waits (modelled s)
                self.emit_many({f"emulated.share.{k}": v for k, v in s.items() if k != "name"}, step,
                               profile=summary["profile"], share=s["name"], **labels)
            elif isinstance(s, dict):
                self.emit_many({f"emulated.{call}.{k}": s.get(k, 0)
                                for k in ("modelled_s", "held_s", "cpu_fraction", "calls", "overruns", "joined")},
                               step, profile=summary["profile"], devices=summary["devices"], **labels)


def process_started_at() -> float | None:
    """When this process started, in epoch seconds (``/proc/self/stat``'s start time against
    the boot-time clock, 10 ms resolution); None where there is no ``/proc``. The start-up
    metrics measure from it: the interpreter and the imports before any of our code runs."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime (the name may hold spaces)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age
