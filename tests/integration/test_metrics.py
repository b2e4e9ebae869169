"""This process's metrics (``taskward.metrics``), recorded once per event through the store's
``TaskMetrics``: admissions, a worker's claims and ends, the reaper's lease expiries and the
outbox's outcomes, on both backends. Values are read from the process's own registry."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import taskward
from taskward import TaskApplication, Workflow
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import WorkerSpec, claim_rows
from taskward.host.source import LocalTaskSource
from taskward.maintenance import LeaseReaper
from taskward.metrics import TaskMetrics
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, lapse_lease, submit
from tests.integration.test_outbox import T0, Recorder, deliverer, terminal_task

TASKS = build_registry(AdapterConfig(imports=("tests.integration.worker_tasks",)))


def sample(metrics: TaskMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def counted(db: StateDB) -> TaskMetrics:
    metrics = TaskMetrics()
    db.metrics = metrics
    return metrics


async def test_admissions_are_counted_by_kind_and_outcome(db: StateDB) -> None:
    metrics = counted(db)
    await submit(db, idempotency_key="same")
    await submit(db, idempotency_key="same")  # a replay: the existing task
    await submit(db)
    apps = [
        TaskApplication(
            action_kind="command",
            args={"argv": ["echo", str(n)]},
            execution_target="host",
            idempotency_key=key,
        )
        for n, key in enumerate(["bulk-1", "bulk-2"])
    ]
    await taskward.submit_tasks(db, apps, registry=REGISTRY)
    await taskward.submit_tasks(db, apps[:1], registry=REGISTRY)
    flow = Workflow("wf-metrics")
    first = flow.step("a", "command", {"argv": ["true"]})
    flow.step("b", "command", {"argv": ["true"]}, after=first)
    await flow.submit(db, registry=REGISTRY)
    await flow.submit(db, registry=REGISTRY)
    name = "taskward_task_admissions_total"
    assert sample(metrics, name, kind="command", outcome="new") == 2 + 2 + 2
    assert sample(metrics, name, kind="command", outcome="existing") == 1 + 1 + 2


async def test_a_store_without_metrics_records_nothing(db: StateDB) -> None:
    assert db.metrics is None
    await submit(db)  # no error: nothing recorded
    assert db.metrics is None


async def test_a_worker_counts_claims_ends_queue_wait_and_run_time(
    db: StateDB, tmp_path: Path
) -> None:
    for _ in range(3):
        await taskward.submit_task(db, app("noop"), registry=TASKS)
    for _ in range(2):
        await taskward.submit_task(db, app("boom", max_attempts=1), registry=TASKS)
    config = WorkerConfig(
        concurrency=4,
        idle_wait_s=0.02,
        run_scheduler=False,
        deliver_outbox=False,
        exit_when_idle=True,
    )
    runtime = WorkerRuntime(db, TASKS, config)
    assert db.metrics is runtime.metrics  # the runtime's own registry, recorded through the store
    assert await asyncio.wait_for(runtime.run(), 120) == 0
    m = runtime.metrics
    assert sample(m, "taskward_task_claims_total", kind="noop") == 3
    assert sample(m, "taskward_task_claims_total", kind="boom") == 2
    assert sample(m, "taskward_task_completions_total", kind="noop", status="completed") == 3
    assert sample(m, "taskward_task_completions_total", kind="boom", status="failed") == 2
    assert sample(m, "taskward_task_run_seconds_count", kind="noop", status="completed") == 3
    assert sample(m, "taskward_task_queue_wait_seconds_count", kind="noop") == 3
    # Each waited from its admission to its claim: at least 0, at most this test's length.
    assert 0 <= sample(m, "taskward_task_queue_wait_seconds_sum", kind="noop") < 3 * 120
    assert sample(m, "taskward_task_run_seconds_sum", kind="noop", status="completed") < 3 * 120
    # A second runtime on another store has a registry of its own (tests run many at once).
    async with taskward.open_db(f"sqlite:///{tmp_path / 'other.db'}") as other:
        assert WorkerRuntime(other, TASKS, config).metrics is not m


async def test_queue_wait_of_a_delayed_task_starts_when_it_is_due(db: StateDB) -> None:
    metrics = counted(db)
    now = await db.now()
    await taskward.submit_task(db, app("noop", run_after=now + 0.5), registry=TASKS)
    source = LocalTaskSource(db, WorkerSpec(worker_id="w-delay", kinds=TASKS.kinds()))
    while not await source.claim_many(1):  # due in 0.5 s, on the store's clock
        await asyncio.sleep(0.02)
    wait = sample(metrics, "taskward_task_queue_wait_seconds_sum", kind="noop")
    assert sample(metrics, "taskward_task_queue_wait_seconds_count", kind="noop") == 1
    assert 0 <= wait < 0.4  # from run_after, not from its admission 0.5 s before it


async def test_lease_expiries_and_their_retries_are_counted(db: StateDB) -> None:
    metrics = counted(db)
    retried = await submit(db, max_attempts=3)
    exhausted = await submit(db, max_attempts=1)
    spec = WorkerSpec(worker_id="w-gone", kinds=REGISTRY.kinds())
    assert len(await claim_rows(db, spec, limit=2)) == 2
    for task_id in (retried, exhausted):
        await lapse_lease(db, task_id)
    counts = await LeaseReaper().run_once(db)
    assert counts == {"expired": 2, "retry_wait": 1, "failed": 1}
    name = "taskward_task_lease_expiries_total"
    assert sample(metrics, name, kind="command", outcome="retry_wait") == 1
    assert sample(metrics, name, kind="command", outcome="failed") == 1
    retries = "taskward_task_retries_scheduled_total"
    assert sample(metrics, retries, kind="command", cause="lease_expired") == 1
    assert (await LeaseReaper().run_once(db))["expired"] == 0  # nothing counted twice
    assert sample(metrics, name, kind="command", outcome="retry_wait") == 1


async def test_outbox_outcomes_are_counted(db: StateDB) -> None:
    metrics = counted(db)
    for _ in range(2):
        await terminal_task(db, "queued", "cancelled")
    async with deliverer(db, Recorder(fail_times=1)) as d:
        counts = await d.run_once(now=T0)
    assert (counts["delivered"], counts["failed"]) == (1, 1)
    name = "taskward_outbox_deliveries_total"
    assert sample(metrics, name, outcome="delivered") == 1
    assert sample(metrics, name, outcome="failed") == 1


def app(kind: str, **fields: object) -> TaskApplication:
    return TaskApplication(
        action_kind=kind,
        args={},
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
        **fields,  # type: ignore[arg-type]
    )
