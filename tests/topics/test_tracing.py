from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from astraflow.topics import Prompt


def test_traceparent_travels_through_kafka(job_topics, make_producer, make_consumer):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    producer = make_producer()
    with tracer.start_as_current_span("dataflow.schedule") as parent:
        producer.send_sync(job_topics.prompts, Prompt("p", "q", "a"))
    untraced = producer.send_sync(job_topics.prompts, Prompt("p2", "q", "a"))
    assert untraced is not None

    consumer = make_consumer(topics=[job_topics.prompts], group_id="trace")
    got = []
    while len(got) < 2:
        batch = consumer.poll(5000)
        assert batch
        got.extend(batch)
    assert dict(got[0].headers)["traceparent"].decode().split("-")[1] == \
        format(parent.get_span_context().trace_id, "032x")
    assert "traceparent" not in dict(got[1].headers)  # no active span, no header
    with tracer.start_as_current_span("raas.rollout", context=got[0].trace_context) as child:
        pass
    assert child.get_span_context().trace_id == parent.get_span_context().trace_id
    assert child.parent.span_id == parent.get_span_context().span_id
    assert trace.get_current_span(got[1].trace_context).get_span_context().is_valid is False
