"""Tracing across processes (issue 28 item 5): a task submitted here inside a span is run by a
real ``taskward worker --burst`` child, which continues the trace from the context stored with
the task. The child's tracer provider is configured by the task module it imports
(``--import tests.fixtures.otel_tasks``, which writes its spans to the file
``TASKWARD_TEST_SPANS`` names); the test reads them back. Both backends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import taskward
from taskward import TaskApplication
from taskward.adapters import AdapterConfig, build_registry
from taskward.store.port import StateDB
from tests.fixtures.otel_tasks import SPANS_ENV
from tests.otel import by_name, memory_provider
from tests.worker_procs import ROOT, worker_argv

MODULE = "tests.fixtures.otel_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))

pytestmark = pytest.mark.slow


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with memory_provider() as exporter:
        yield exporter


def run_burst_worker(db_url: str, spans_file: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{SPANS_ENV: str(spans_file)})
    return subprocess.run(
        worker_argv(db_url, "--burst", imports=(MODULE,)),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_a_worker_process_continues_the_trace_of_a_task_submitted_here(
    db: StateDB, db_url: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("tests.acceptance.test_tracing_worker_process")
    with tracer.start_as_current_span("request"):
        task_id = await taskward.submit_task(
            db,
            TaskApplication(
                action_kind="traced_step",
                args={"label": "child"},
                execution_target="host",
                idempotency_key=f"otel-proc-{uuid.uuid4()}",
            ),
            registry=REGISTRY,
        )
    admit = by_name(spans)["taskward.admit"].get_span_context()

    spans_file = tmp_path / "child-spans.jsonl"
    done = await asyncio.to_thread(run_burst_worker, db_url, spans_file)
    assert done.returncode == 0, done.stderr
    assert (await taskward.get_task(db, task_id))["status"] == "completed"

    child: dict[str, Any] = {}
    for line in spans_file.read_text(encoding="utf-8").splitlines():
        span = json.loads(line)
        child[span["name"]] = span
    run, inside = child["taskward.run traced_step"], child["inside child"]
    # the child's run span: this trace, under this process's admission span
    assert run["trace_id"] == f"{admit.trace_id:032x}"
    assert run["parent_span_id"] == f"{admit.span_id:016x}"
    assert run["kind"] == "CONSUMER"
    assert run["attributes"]["taskward.task.id"] == task_id
    assert run["attributes"]["taskward.task.status"] == "completed"
    # the task's own span, inside the run's, in the same trace
    assert inside["trace_id"] == run["trace_id"]
    assert inside["parent_span_id"] == run["span_id"]
