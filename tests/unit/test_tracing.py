"""``taskward.tracing`` (issue 28 item 5): the stored context's bounds and parsing, the no-op
paths without a tracer provider, and the run span's end (no store: the integration tests run
the spans through admission and a worker)."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.trace import StatusCode

from taskward import tracing
from tests.otel import by_name, memory_provider, reset_provider

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def remote(state: trace.TraceState | None = None) -> trace.NonRecordingSpan:
    return trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=TRACE_ID,
            span_id=SPAN_ID,
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            trace_state=state,
        )
    )


def test_a_stored_context_names_the_parent_and_anything_else_a_root() -> None:
    parent = trace.get_current_span(
        tracing.parent_context(json.dumps({"traceparent": TRACEPARENT}))
    )
    assert (parent.get_span_context().trace_id, parent.get_span_context().span_id) == (
        TRACE_ID,
        SPAN_ID,
    )
    for stored in (None, "", "not json", "[1]", '{"traceparent": 7}', "x" * 5000):
        context = tracing.parent_context(stored)
        assert not trace.get_current_span(context).get_span_context().is_valid, stored


def test_without_a_provider_admission_starts_nothing_and_stores_a_callers_context() -> None:
    reset_provider()
    assert not tracing.is_tracing()
    with tracing.admission_span("library", kind="k", key="key") as span:
        assert span is tracing.NOT_TRACED and span.trace_context is None
        assert not span.recording
    state = trace.TraceState([("vendor", "value")])
    with trace.use_span(remote(state)), tracing.admission_span("library") as span:
        assert json.loads(span.trace_context or "") == {
            "traceparent": TRACEPARENT,
            "tracestate": "vendor=value",
        }
        assert not span.recording
    assert tracing.start_run({"id": "t", "action_kind": "k"}, 1, "w/1", "w") is None


def test_a_tracestate_past_the_bound_is_dropped_and_the_traceparent_kept() -> None:
    reset_provider()
    state = trace.TraceState([(f"vendor{i}", "v" * 200) for i in range(20)])
    with trace.use_span(remote(state)), tracing.admission_span("library") as span:
        assert json.loads(span.trace_context or "") == {"traceparent": TRACEPARENT}


def test_a_refused_acknowledgement_ends_the_run_span_with_an_error() -> None:
    with memory_provider() as exporter:
        assert tracing.is_tracing()
        span = tracing.start_run({"id": "t-1", "action_kind": "k"}, 2, "w/2", "w")
        tracing.end_run(span, state="retry_wait", applied=False, adapter_status="completed")
        ended = by_name(exporter)["taskward.run k"]
    assert ended.status.status_code is StatusCode.ERROR
    assert "acknowledgement refused" in (ended.status.description or "")
    assert (ended.attributes or {})["taskward.ack.applied"] is False
    # a root span: no context was stored with the task
    assert ended.parent is None
