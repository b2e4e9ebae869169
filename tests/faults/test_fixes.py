"""What the fault scenarios found, fixed and pinned, on both backends with time injected:

- ``claim_and_execute`` (ADR-0071 D4) completed runs without a summary: it now writes the
  complete summary first, as the resident host does (ADR-0037 D4);
- lowering the stored attempt ceiling stranded idle rows at it (R6, no edge out): each row now
  stores its own ceiling at admission (R18), so lowering the queue's strands nothing, and a row
  promoted out of ``retry_wait`` at its own ceiling is ended ``queued -> skipped`` with reason
  ``attempt_ceiling`` at once;
- the ``command`` adapter had no memory limit: ``memory_limit_mb`` caps the child's address
  space (``RLIMIT_AS``) and a breach is a retryable failure, unlike a plain non-zero exit;
- a command outlived a worker killed outright: it now dies with it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import taskward
from taskward.adapters import AdapterConfig, CommandAdapter, build_registry
from taskward.checker import assert_invariants, check_invariants
from taskward.claims import WorkerSpec, claim_runs
from taskward.errors import TaskValidationError
from taskward.execution import RetryPolicy, settle_lease
from taskward.maintenance.reaper import promote_due_retries
from taskward.registry import CancellationToken, TaskExecutionResult
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB
from tests.worker_procs import ROOT

MODULES = ("tests.integration.worker_tasks", "tests.faults.fault_tasks")
PYTHON = sys.executable
REGISTRY = build_registry(
    AdapterConfig(imports=MODULES, command_allowlist=frozenset({PYTHON, "false"}))
)
NO_JITTER = RetryPolicy(base_s=10.0, factor=2.0, cap_s=100.0, jitter=0.0)
T0 = 1_000_000.0


async def submit(
    db: StateDB, kind: str = "noop", args: dict | None = None, *, max_attempts: int | None = None
) -> str:
    key = str(uuid.uuid4())
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args or {},
        execution_target="host",
        idempotency_key=key,
        max_attempts=max_attempts,
    )
    return await taskward.submit_task(db, app, registry=REGISTRY, now=T0)


def spec(worker_id: str = "host:f1f1f1f1") -> WorkerSpec:
    return WorkerSpec(worker_id=worker_id, kinds=REGISTRY.kinds())


async def facts(db: StateDB, task_id: str) -> list[tuple[str, str]]:
    return [(f["status"], f["reason_code"]) for f in await taskward.list_transitions(db, task_id)]


# -- (a) claim_and_execute writes the summary before it completes ----------------------------


async def test_claim_and_execute_writes_a_complete_summary_before_completing(db: StateDB) -> None:
    ids = [await submit(db) for _ in range(3)]
    ran = await taskward.claim_and_execute(
        db, worker_id="host:5c5c5c5c", registry=REGISTRY, now=T0 + 1
    )
    assert ran == 3
    for task_id in ids:
        summary = await db.fetchone("summary_get", {"session_key": f"{task_id}:1"})
        assert summary is not None and summary["state"] == "complete"
        assert summary["summary"]["facts"]["run_id"] == f"{task_id}:1"
        [_, completed] = await taskward.list_transitions(db, task_id)
        assert completed["status"] == "completed"
        assert {"kind": "summary", "session_key": f"{task_id}:1"} in completed["evidence_refs"]
        assert summary["updated_at"] <= completed["created_at"]
    # held to summary-before-complete like the resident host (this failed before the fix)
    await assert_invariants(db, now=T0 + 2, require_summaries=True)


async def test_claim_and_execute_never_completes_a_run_whose_summary_cannot_be_written(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    # Another writer already completed a different summary under this run's session key.
    async with db.transaction(now=T0) as tx:
        await tx.fetchone(
            "summary_write",
            {
                "session_key": f"{task_id}:1",
                "task_id": task_id,
                "attempt": 1,
                "summary": '{"facts":{},"manifest_ref":"x","narrative":"other"}',
                "summary_hash": "not-this-one",
            },
        )
    await taskward.claim_and_execute(db, worker_id="host:5c5c5c5d", registry=REGISTRY, now=T0 + 1)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "retry_wait"
    assert "summary_failed" in row["error_detail"]
    # The resident host's classification (the one outcome table): a retry for want of a summary
    # says so in its reason (ADR-0037 D5 ``summary_failed``).
    assert await facts(db, task_id) == [("running", "claimed"), ("retry_wait", "summary_failed")]


# -- (b) a lowered ceiling: nothing is stranded (R18), a retry at its own ceiling is skipped ---


async def _fail_every_claimable(db: StateDB, *, now: float) -> list[str]:
    """Claim whatever is claimable and settle each lease as a retryable failure, judged by a
    ceiling of 5 whatever the row's own (as a row stored before R18 could be)."""
    failed = []
    for lease in await claim_runs(db, spec(), now=now):
        result = TaskExecutionResult(status="failed", retryable=True, error_detail="again")
        await settle_lease(
            db, lease, result, actor=spec().actor, max_attempts=5, policy=NO_JITTER, now=now
        )
        failed.append(lease.task_id)
    return failed


async def test_a_queued_row_keeps_its_ceiling_when_the_queue_ceiling_is_lowered(
    db: StateDB,
) -> None:
    await set_max_attempts(db, 5)
    kept = await submit(db)
    assert await _fail_every_claimable(db, now=T0) == [kept]
    await promote_due_retries(db, now=T0 + 100)
    assert await _fail_every_claimable(db, now=T0 + 100) == [kept]
    await taskward.reap_expired_leases(db, now=T0 + 1000, retry_policy=NO_JITTER)
    assert (await taskward.get_task(db, kept))["status"] == "queued"
    await set_max_attempts(db, 2)  # at the row's attempts: it keeps the 5 of its admission
    assert await check_invariants(db, now=T0 + 1001) == []
    counts = await taskward.reap_expired_leases(db, now=T0 + 1001, retry_policy=NO_JITTER)
    assert counts["skipped"] == 0
    [lease] = await claim_runs(db, spec(), now=T0 + 1002)
    assert (lease.task_id, lease.attempt) == (kept, 3)
    row = await taskward.get_task(db, kept)
    assert (row["status"], row["max_attempts"]) == ("running", 5)
    await assert_invariants(db, now=T0 + 1002)


async def test_a_retry_promoted_at_its_own_ceiling_is_skipped_at_once(db: StateDB) -> None:
    await set_max_attempts(db, 5)
    task_id = await submit(db, max_attempts=1)
    below = await submit(db)
    assert sorted(await _fail_every_claimable(db, now=T0)) == sorted([task_id, below])
    assert (await taskward.get_task(db, task_id))["status"] == "retry_wait"
    await taskward.reap_expired_leases(db, now=T0 + 1, retry_policy=NO_JITTER)  # not due yet
    await set_max_attempts(db, 1)  # R18: reaches neither stored row
    counts = await taskward.reap_expired_leases(db, now=T0 + 1000, retry_policy=NO_JITTER)
    assert counts["queued"] == 2 and counts["skipped"] == 1
    assert await facts(db, task_id) == [
        ("running", "claimed"),
        ("retry_wait", "retryable_failure"),
        ("queued", "retry_ready"),
        ("skipped", "attempt_ceiling"),
    ]
    last = (await taskward.list_transitions(db, task_id))[-1]
    assert last["metadata"]["attempt_ceiling"] == 1
    assert (await taskward.get_task(db, below))["status"] == "queued"
    await assert_invariants(db, now=T0 + 1000)


async def test_two_reapers_racing_over_a_retry_at_its_ceiling_write_one_fact(
    db: StateDB, db_url: str
) -> None:
    ids = [await submit(db, max_attempts=1) for _ in range(5)]
    assert sorted(await _fail_every_claimable(db, now=T0)) == sorted(ids)
    other = await taskward.open_db(db_url)
    try:
        a, b = await asyncio.gather(
            taskward.reap_expired_leases(db, now=T0 + 100, retry_policy=NO_JITTER),
            taskward.reap_expired_leases(other, now=T0 + 100, retry_policy=NO_JITTER),
        )
    finally:
        await other.close()
    assert a["skipped"] + b["skipped"] == 5
    for task_id in ids:
        assert [s for s, _ in await facts(db, task_id)] == [
            "running",
            "retry_wait",
            "queued",
            "skipped",
        ]
    await assert_invariants(db, now=T0 + 100)


async def test_a_raised_ceiling_strands_nothing(db: StateDB) -> None:
    task_id = await submit(db)
    assert await _fail_every_claimable(db, now=T0) == [task_id]
    await set_max_attempts(db, 9)
    counts = await taskward.reap_expired_leases(db, now=T0 + 1000, retry_policy=NO_JITTER)
    assert counts["skipped"] == 0 and counts["queued"] == 1
    assert (await taskward.get_task(db, task_id))["status"] == "queued"


# -- memory_limit_mb: the command adapter's RLIMIT_AS ----------------------------------------


BOMB = [PYTHON, "-c", "x = bytearray(1 << 34)"]  # 16 GiB, far above any limit below


async def _run(args: dict[str, object]) -> TaskExecutionResult:
    adapter = CommandAdapter(allowlist=[PYTHON, "false"])
    adapter.validate_args(args)
    return await adapter.execute({"action_args": args}, cancellation=CancellationToken())


async def test_a_memory_bomb_under_its_limit_is_a_retryable_failure() -> None:
    result = await _run({"argv": BOMB, "memory_limit_mb": 256})
    assert result.status == "failed" and result.retryable
    assert result.error_detail is not None
    assert "memory limit of 256 MiB exceeded" in result.error_detail
    assert result.evidence_refs[0]["memory_limit_mb"] == 256


async def test_work_within_its_memory_limit_completes() -> None:
    small = [PYTHON, "-c", "x = bytearray(1 << 20); print(len(x))"]
    result = await _run({"argv": small, "memory_limit_mb": 256})
    assert result.status == "completed", result.error_detail


async def test_a_plain_non_zero_exit_under_a_memory_limit_is_not_retryable() -> None:
    result = await _run({"argv": ["false"], "memory_limit_mb": 256})
    assert result.status == "failed" and not result.retryable


async def test_without_a_limit_an_out_of_memory_death_is_a_plain_failure() -> None:
    # The limit is what makes the cause known; without one nothing is guessed.
    result = await _run({"argv": [PYTHON, "-c", "raise MemoryError"]})
    assert result.status == "failed" and not result.retryable


@pytest.mark.parametrize("bad", [0, -1, True, "256", float("inf"), 2**31])
def test_memory_limit_mb_must_be_a_positive_number_of_mib(bad: object) -> None:
    with pytest.raises(TaskValidationError) as caught:
        adapter = CommandAdapter(allowlist=["false"])
        adapter.validate_args({"argv": ["false"], "memory_limit_mb": bad})
    assert caught.value.field == "args.memory_limit_mb"


# -- a command does not outlive a worker killed outright -------------------------------------

_RUNS_A_COMMAND = """
import asyncio, sys
from taskward.adapters.process import run_process
from taskward.registry import CancellationToken
code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
asyncio.run(run_process([sys.executable, "-c", code, sys.argv[1]],
                        cancellation=CancellationToken()))
"""


async def test_a_command_dies_with_its_worker_when_the_worker_is_sigkilled(
    tmp_path: Path,
) -> None:
    """Found by the SIGKILL scenarios: the child (a session of its own) outlived its worker and
    ran on beside the task's next attempt. It now gets SIGKILL when its parent dies."""
    pid_file = tmp_path / "child.pid"
    worker = subprocess.Popen([PYTHON, "-c", _RUNS_A_COMMAND, str(pid_file)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the command never started"
            await asyncio.sleep(0.02)
        child = int(pid_file.read_text())
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 5
    while _alive(child):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            raise AssertionError(f"command {child} outlived its SIGKILLed worker")
        await asyncio.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie nobody reaped yet is dead: its parent (the killed worker) is gone
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return True
