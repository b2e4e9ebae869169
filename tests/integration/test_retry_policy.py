"""A kind's retry policy through the worker (DESIGN.md R18), on both backends, time injected:
``retry_on`` decides whether a raise is retried, the kind's ``backoff`` when; kinds without a
policy, and other adapters, keep the worker's default."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import WorkerSpec, claim_runs
from taskward.execution import RetryPolicy
from taskward.maintenance.reaper import promote_due_retries
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import StateDB
from tests.fixtures.retry_tasks import PATIENT_BACKOFF, PICKY_BACKOFF

RETRY = "tests.fixtures.retry_tasks"
REGISTRY = build_registry(
    AdapterConfig(
        imports=(RETRY,), python_modules=frozenset({RETRY}), command_allowlist=frozenset({"false"})
    )
)
# The worker's default backoff: 10 s, 20 s, ... (every kind's backoff here differs from it).
WORKER_DEFAULT = RetryPolicy(base_s=10.0, factor=2.0, cap_s=100.0, jitter=0.0)
T0 = 1_000_000.0
WORKER = "host:aaaaaaaa"


async def submit(db: StateDB, kind: str, args: dict[str, Any], *, now: float = T0) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args,
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
    )
    return await taskward.submit_task(db, app, registry=REGISTRY, now=now)


async def run_at(db: StateDB, now: float) -> int:
    await promote_due_retries(db, now=now)
    return await taskward.claim_and_execute(
        db, worker_id=WORKER, registry=REGISTRY, now=now, retry_policy=WORKER_DEFAULT
    )


async def statuses(db: StateDB, task_id: str) -> list[str]:
    return [f["status"] for f in await taskward.list_transitions(db, task_id)]


async def test_a_kind_retries_an_exception_of_its_retry_on_after_its_own_backoff(
    db: StateDB,
) -> None:
    task_id = await submit(db, "picky", {"error": "ValueError"})
    assert await run_at(db, T0) == 1
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"]) == ("retry_wait", "retryable_failure")
    assert row["retry_at"] - T0 == PICKY_BACKOFF.delay(1) == 30.0  # the kind's, not 10 s
    assert "raised ValueError" in row["error_detail"]

    assert await run_at(db, T0 + 29) == 0  # not due before the kind's backoff
    assert await run_at(db, T0 + 30) == 1
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "retry_wait" and row["retry_at"] - (T0 + 30) == 90.0  # 30 * 3

    assert await run_at(db, T0 + 120) == 1  # the third attempt: the queue's ceiling (3)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"]) == ("failed", "attempt_ceiling")
    assert await statuses(db, task_id) == ["running", "retry_wait", "queued"] * 2 + [
        "running",
        "failed",
    ]


async def test_a_kind_fails_at_once_on_an_exception_outside_its_retry_on(db: StateDB) -> None:
    task_id = await submit(db, "picky", {"error": "KeyError"})
    await run_at(db, T0)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"], row["exit_code"]) == (
        "failed",
        "execution_failed",
        1,
    )
    assert row["retry_at"] is None
    assert "KeyError is not in retry_on: ValueError" in row["error_detail"]
    assert await statuses(db, task_id) == ["running", "failed"]
    fact = (await taskward.list_transitions(db, task_id))[-1]
    assert {"kind": "retry_on", "exception": "KeyError", "retry_on": ["ValueError"]}.items() <= (
        fact["evidence_refs"][-1].items()
    )


async def test_a_retry_on_kind_without_a_backoff_waits_the_workers_default(db: StateDB) -> None:
    task_id = await submit(db, "picky_default_backoff", {"error": "Transient"})
    await run_at(db, T0)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "retry_wait" and row["retry_at"] - T0 == WORKER_DEFAULT.delay(1)


async def test_a_kind_without_retry_on_fails_at_once_as_before(db: StateDB) -> None:
    # ``patient`` sets max_attempts and a backoff, but no retry_on: a raise is not retried.
    for kind in ("patient", "bare"):
        task_id = await submit(db, kind, {"error": "ValueError"})
        await run_at(db, T0)
        row = await taskward.get_task(db, task_id)
        assert (row["status"], row["status_reason_code"]) == ("failed", "execution_failed")
        assert row["error_detail"] == "ValueError: raised ValueError"
        assert await statuses(db, task_id) == ["running", "failed"]


async def test_a_kinds_backoff_times_a_retryable_result_it_reports(db: StateDB) -> None:
    task_id = await submit(db, "patient", {})
    await run_at(db, T0)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "retry_wait" and row["retry_at"] - T0 == PATIENT_BACKOFF.delay(1)


async def test_an_expired_lease_of_a_kind_is_retried_after_the_kinds_backoff(
    db: StateDB,
) -> None:
    picky = await submit(db, "picky", {"error": "ValueError"})
    command = await submit(db, "command", {"argv": ["false"]})
    spec = WorkerSpec(worker_id=WORKER, kinds=REGISTRY.kinds())
    leases = await claim_runs(db, spec, now=T0)
    late = max(lease.lease_expires_at for lease in leases) + 1
    counts = await taskward.reap_expired_leases(
        db, now=late, retry_policy=WORKER_DEFAULT, registry=REGISTRY
    )
    assert counts["expired"] == 2
    rows = {task_id: await taskward.get_task(db, task_id) for task_id in (picky, command)}
    assert rows[picky]["status_reason_code"] == "lease_expired"
    assert rows[picky]["retry_at"] - late == PICKY_BACKOFF.delay(1)
    # command has no policy of its own: the worker's default, though the registry has others.
    assert rows[command]["retry_at"] - late == WORKER_DEFAULT.delay(1)


async def test_a_reaper_without_the_kind_in_its_registry_uses_its_default(db: StateDB) -> None:
    task_id = await submit(db, "picky", {"error": "ValueError"})
    [lease] = await claim_runs(db, WorkerSpec(worker_id=WORKER, kinds=["picky"]), now=T0)
    late = lease.lease_expires_at + 1
    await taskward.reap_expired_leases(
        db, now=late, retry_policy=WORKER_DEFAULT, registry=build_registry()
    )
    row = await taskward.get_task(db, task_id)
    assert row["retry_at"] - late == WORKER_DEFAULT.delay(1)


async def test_an_unrelated_command_kind_is_unaffected(db: StateDB) -> None:
    assert REGISTRY.retry_policy_for("command") is None
    task_id = await submit(db, "command", {"argv": ["false"]})
    await run_at(db, T0)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"], row["exit_code"]) == (
        "failed",
        "execution_failed",
        1,
    )
    evidence = (await taskward.list_transitions(db, task_id))[-1]["evidence_refs"]
    assert [ref["kind"] for ref in evidence] == ["process"]


async def test_the_worker_runtime_times_retries_by_the_kinds_backoff(db: StateDB) -> None:
    """``taskward worker``'s runtime asks the registry too: its acknowledgements and its lease
    reaper. Store time here (the runtime takes no ``now``): bounded by the wall clock around."""
    config = WorkerConfig(
        concurrency=1,
        idle_wait_s=0.02,
        reap_interval_s=30.0,
        run_scheduler=False,
        deliver_outbox=False,
        retry_policy=WORKER_DEFAULT,
    )
    ended = asyncio.Event()
    runtime = WorkerRuntime(
        db, REGISTRY, config, on_event=lambda kind, *_: ended.set() if kind == "end" else None
    )
    task_id = await submit(db, "picky", {"error": "ValueError"}, now=time.time())
    before = time.time()
    serving = asyncio.create_task(runtime.run())
    await asyncio.wait_for(ended.wait(), 60)  # the acknowledgement is written
    after = time.time()
    runtime.drain("test")
    assert await asyncio.wait_for(serving, 60) == 0
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "retry_wait"
    assert before + 30.0 - 1.0 <= row["retry_at"] <= after + 30.0 + 1.0
    assert runtime.maintenance.leases.policy_for("picky") == PICKY_BACKOFF
    assert runtime.maintenance.leases.policy_for("command") == WORKER_DEFAULT


async def test_a_kinds_max_attempts_is_stored_on_its_rows_but_not_hashed(db: StateDB) -> None:
    """R18: ``patient`` (max_attempts=5) stores 5 on a row whose application names no ceiling;
    an application's own ceiling wins; the kind's default is configuration, not part of the
    application's hash (the same application under a registry without the kind's default
    replays)."""
    from taskward.admission import validate_application

    own = await submit(db, "patient", {})
    assert (await taskward.get_task(db, own))["max_attempts"] == 5
    app = taskward.TaskApplication(
        action_kind="patient",
        args={},
        execution_target="host",
        idempotency_key="k-own",
        max_attempts=2,
    )
    explicit = await taskward.submit_task(db, app, registry=REGISTRY, now=T0)
    assert (await taskward.get_task(db, explicit))["max_attempts"] == 2
    plain = taskward.TaskApplication(
        action_kind="patient", args={}, execution_target="host", idempotency_key="k"
    )
    admitted = validate_application(plain, REGISTRY)
    assert admitted.max_attempts == 5
    bare = taskward.TaskApplication(
        action_kind="bare", args={"error": "x"}, execution_target="host", idempotency_key="k"
    )
    assert validate_application(bare, REGISTRY).max_attempts is None
    d2 = taskward.admission.application_hash_of("patient", "{}", "host", [], None, None)
    assert admitted.application_hash == d2
