"""Tracing (issue 28 item 5) on both backends: admission's span and the W3C trace context stored
with the task, the run's span that an in-process worker continues from it (the adapter's code
inside, the terminal transition on it), and the paths that admit without a span of their own
(batches, a caller's transaction) -- with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import taskward
from taskward import TaskApplication
from taskward.adapters import AdapterConfig, build_registry
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import StateDB
from tests.otel import by_name, memory_provider, picked, reset_provider, traceparent

MODULE = "tests.fixtures.otel_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))


def tracer() -> trace.Tracer:
    """The test's tracer, from the provider set now (a module-level proxy would keep the first
    test's provider)."""
    return trace.get_tracer("tests.integration.test_tracing")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with memory_provider() as exporter:
        yield exporter


def app(kind: str = "traced_step", key: str | None = None, **args: Any) -> TaskApplication:
    return TaskApplication(
        action_kind=kind,
        args=args,
        execution_target="host",
        idempotency_key=key or f"otel-{uuid.uuid4()}",
    )


async def drain(db: StateDB) -> None:
    config = WorkerConfig(
        concurrency=2,
        idle_wait_s=0.02,
        run_scheduler=False,
        deliver_outbox=False,
        exit_when_idle=True,
    )
    assert await asyncio.wait_for(WorkerRuntime(db, REGISTRY, config).run(), 60) == 0


async def stored(db: StateDB, task_id: str) -> dict[str, str] | None:
    row = await taskward.get_task(db, task_id)
    text = row["trace_context"]
    return None if text is None else json.loads(text)


async def test_a_task_admitted_in_a_span_runs_in_its_trace_under_the_admission_span(
    db: StateDB, spans: InMemorySpanExporter
) -> None:
    with tracer().start_as_current_span("request") as request:
        task_id = await taskward.submit_task(
            db, app(key="otel:one", label="one"), registry=REGISTRY
        )
    trace_id = request.get_span_context().trace_id
    admit = by_name(spans)["taskward.admit"]
    # admission: a producer span under the caller's, whose context is stored with the task
    assert admit.parent is not None and admit.parent.span_id == request.get_span_context().span_id
    assert admit.kind is SpanKind.PRODUCER
    expected: dict[str, object] = {
        "taskward.task.id": task_id,
        "taskward.task.kind": "traced_step",
        "taskward.task.key": "otel:one",
        "taskward.admission.result": "created",
        "taskward.admission.source": "library",
    }
    assert picked(admit, expected) == expected
    assert await stored(db, task_id) == {"traceparent": traceparent(admit)}

    spans.clear()
    await drain(db)
    found = by_name(spans)
    run, inside = found["taskward.run traced_step"], found["inside one"]
    # the run: a consumer span in the same trace, child of admission's; the adapter's code in it
    assert run.get_span_context().trace_id == trace_id
    assert run.parent is not None and run.parent.span_id == admit.get_span_context().span_id
    assert run.kind is SpanKind.CONSUMER
    assert inside.parent is not None and inside.parent.span_id == run.get_span_context().span_id
    # the terminal transition, recorded on it
    expected = {
        "taskward.task.id": task_id,
        "taskward.task.kind": "traced_step",
        "taskward.task.attempt": 1,
        "taskward.task.status": "completed",
        "taskward.ack.applied": True,
        "taskward.adapter.status": "completed",
        "taskward.task.reason": "completed",
    }
    assert picked(run, expected) == expected
    assert run.status.status_code is StatusCode.UNSET
    assert run.end_time is not None and inside.end_time is not None
    assert run.end_time >= inside.end_time


async def test_a_failed_run_ends_its_span_with_an_error_and_the_reason(
    db: StateDB, spans: InMemorySpanExporter
) -> None:
    with tracer().start_as_current_span("request"):
        task_id = await taskward.submit_task(db, app("traced_boom"), registry=REGISTRY)
    await drain(db)
    assert (await taskward.get_task(db, task_id))["status"] == "failed"
    found = by_name(spans)
    run = found["taskward.run traced_boom"]
    assert run.parent is not None
    assert run.parent.span_id == found["taskward.admit"].get_span_context().span_id
    attributes = dict(run.attributes or {})
    assert attributes["taskward.task.status"] == "failed"
    assert attributes["taskward.adapter.status"] == "failed"
    assert run.status.status_code is StatusCode.ERROR
    assert attributes["taskward.task.reason"] in (run.status.description or "")


async def test_a_replayed_key_keeps_the_first_context_and_its_span_says_existing(
    db: StateDB, spans: InMemorySpanExporter
) -> None:
    with tracer().start_as_current_span("first"):
        task_id = await taskward.submit_task(db, app(key="otel:replay"), registry=REGISTRY)
    first = await stored(db, task_id)
    with tracer().start_as_current_span("second"):
        again = await taskward.submit_task(db, app(key="otel:replay"), registry=REGISTRY)
    assert again == task_id
    assert await stored(db, task_id) == first
    results = [
        (s.attributes or {}).get("taskward.admission.result")
        for s in spans.get_finished_spans()
        if s.name == "taskward.admit"
    ]
    assert results == ["created", "existing"]


async def test_a_batch_stores_the_context_of_its_one_admission_span(
    db: StateDB, spans: InMemorySpanExporter
) -> None:
    taken = await taskward.submit_task(db, app(key="otel:batch-0"), registry=REGISTRY)
    spans.clear()
    with tracer().start_as_current_span("request"):
        ids = await taskward.submit_tasks(
            db, [app(key=f"otel:batch-{i}") for i in range(3)], registry=REGISTRY
        )
    admit = by_name(spans)["taskward.admit"]
    expected: dict[str, object] = {
        "taskward.admission.count": 3,
        "taskward.admission.created": 2,
    }
    assert picked(admit, expected) == expected
    assert ids[0] == taken
    for task_id in ids[1:]:
        assert await stored(db, task_id) == {"traceparent": traceparent(admit)}


async def test_admission_in_a_callers_transaction_stores_its_span_context(
    db: StateDB, db_url: str, spans: InMemorySpanExporter
) -> None:
    """R24 through the same path: a synchronous connection, and an async SQLAlchemy session
    (on SQLite through aiosqlite, whose admission runs in the driver's thread)."""
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    def scenario() -> str:
        connect: Any = sqlite3.connect if db_url.startswith("sqlite") else psycopg.connect
        target = (
            db_url.removeprefix("sqlite:///").split("?", 1)[0] if "sqlite" in db_url else db_url
        )
        conn = connect(target)
        try:
            with tracer().start_as_current_span("view"):
                task_id = taskward.submit_task_sync(
                    conn, app(key="otel:tx-sync"), registry=REGISTRY
                )
            conn.commit()
            return str(task_id)
        finally:
            conn.close()

    sync_id = await asyncio.to_thread(scenario)
    admit = by_name(spans)["taskward.admit"]
    assert await stored(db, sync_id) == {"traceparent": traceparent(admit)}
    assert dict(admit.attributes or {})["taskward.task.id"] == sync_id

    spans.clear()
    if db_url.startswith("sqlite"):
        url = "sqlite+aiosqlite:///" + db_url.removeprefix("sqlite:///").split("?", 1)[0]
    else:
        url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_async_engine(url)
    try:
        with tracer().start_as_current_span("endpoint"):
            async with AsyncSession(engine) as session, session.begin():
                async_id = await taskward.submit_task(
                    session, app(key="otel:tx-async"), registry=REGISTRY
                )
    finally:
        await engine.dispose()
    found = by_name(spans)
    admit = found["taskward.admit"]
    assert admit.parent is not None
    assert admit.parent.span_id == found["endpoint"].get_span_context().span_id
    assert await stored(db, async_id) == {"traceparent": traceparent(admit)}


async def test_without_a_tracer_provider_nothing_is_started_and_only_a_callers_context_stored(
    db: StateDB,
) -> None:
    """The API imported, no provider (its no-op tracer): no span, and a task admitted with no
    active span stores nothing; one admitted under a propagated context (a process that only
    propagates) stores that context, and the run is not traced."""
    reset_provider()
    plain = await taskward.submit_task(db, app(), registry=REGISTRY)
    assert await stored(db, plain) is None
    remote = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    with trace.use_span(trace.NonRecordingSpan(remote)):
        propagated = await taskward.submit_task(db, app(), registry=REGISTRY)
    assert await stored(db, propagated) == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    }
    await drain(db)
    for task_id in (plain, propagated):
        assert (await taskward.get_task(db, task_id))["status"] == "completed"


async def test_a_command_tasks_program_gets_the_runs_trace_context_in_its_environment(
    db: StateDB, spans: InMemorySpanExporter
) -> None:
    """A ``command`` task's program continues the run's trace: ``TRACEPARENT`` in its
    environment names the run span (the OpenTelemetry environment-carrier names); a task's own
    ``env`` still wins over it."""
    commands = build_registry(AdapterConfig(command_allowlist=frozenset({"sh"})))
    script = 'printf "%s|%s" "$TRACEPARENT" "$TRACESTATE"'
    with tracer().start_as_current_span("request"):
        traced = await taskward.submit_task(
            db, app("command", argv=["sh", "-c", script]), registry=commands
        )
        overridden = await taskward.submit_task(
            db,
            app("command", argv=["sh", "-c", script], env={"TRACEPARENT": "mine"}),
            registry=commands,
        )
    config = WorkerConfig(
        concurrency=1,
        idle_wait_s=0.02,
        run_scheduler=False,
        deliver_outbox=False,
        exit_when_idle=True,
    )
    assert await asyncio.wait_for(WorkerRuntime(db, commands, config).run(), 60) == 0

    async def output(task_id: str) -> str:
        row = await taskward.get_task(db, task_id)
        assert row["status"] == "completed", row
        refs = row["status_evidence_refs"]
        refs = json.loads(refs) if isinstance(refs, str) else refs
        [process] = [ref for ref in refs if ref.get("kind") == "process"]
        return str(process["output_tail"])

    runs = [s for s in spans.get_finished_spans() if s.name == "taskward.run command"]
    by_task = {dict(s.attributes or {})["taskward.task.id"]: s for s in runs}
    assert await output(traced) == f"{traceparent(by_task[traced])}|"
    assert await output(overridden) == "mine|"
