"""The tracing tests' tracer provider: the OpenTelemetry SDK with its in-memory exporter, set as
the global provider for one test and taken away after it (the API lets a process set its
provider once; the tests reset its globals, as OpenTelemetry's own test utilities do)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_provider() -> None:
    """No global tracer provider: the API's proxy answers again."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def memory_provider() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider exporting every ended span to memory, global while it is open."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        reset_provider()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The finished spans by name (each name once in these tests)."""
    spans = exporter.get_finished_spans()
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent naming ``span``."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def picked(span: ReadableSpan, expected: dict[str, object]) -> dict[str, object]:
    """``span``'s attributes of the names in ``expected`` (compare the two)."""
    attributes = dict(span.attributes or {})
    return {name: attributes.get(name) for name in expected}
