"""W3C trace context through Kafka headers.

A producer injects the current span's context as the ``traceparent`` header; a consumer
extracts it to parent (or link) the span that processes the record, so one trace
follows a prompt across processes. Exporter setup lives with the processes that
emit spans, not here.
"""

from __future__ import annotations

from typing import Iterable

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .codec import H_TRACE, Headers, header

_propagator = TraceContextTextMapPropagator()


def inject(headers: Headers, ctx: otel_context.Context | None = None) -> Headers:
    """Append ``traceparent`` for ``ctx`` (default: the current context) when a span is active."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=ctx)
    if H_TRACE in carrier:
        headers.append((H_TRACE, carrier[H_TRACE].encode()))
    return headers


def extract(headers: Iterable[tuple[str, bytes]] | None) -> otel_context.Context:
    """The remote context carried by a record's headers (empty context when none)."""
    raw = header(headers, H_TRACE)
    if raw is None:
        return otel_context.Context()
    return _propagator.extract({H_TRACE: raw.decode("ascii", "replace")})


def traceparent_of(ctx: otel_context.Context) -> str | None:
    """The ``traceparent`` string of a context, for payloads that carry it in a field."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=ctx)
    return carrier.get(H_TRACE)


def span_context(headers: Iterable[tuple[str, bytes]] | None) -> trace.SpanContext | None:
    """The remote span context of a record (for span links), or None."""
    sc = trace.get_current_span(extract(headers)).get_span_context()
    return sc if sc.is_valid else None
