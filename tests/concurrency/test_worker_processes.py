"""End to end with real worker processes (ADR-0071 D4, ADR-0072 D5, R4), on both backends.

Processes use short leases; the tests wait on database conditions with a timeout, never on a
fixed sleep.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.store.port import StateDB
from tests.worker_procs import wait_until, worker_argv, workers

MODULE = "tests.integration.worker_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))

pytestmark = pytest.mark.slow


async def submit(db: StateDB, kind: str, args: dict[str, object]) -> str:
    app = taskward.TaskApplication(
        action_kind=kind, args=args, execution_target="host", idempotency_key=f"k-{uuid.uuid4()}"
    )
    return await taskward.submit_task(db, app, registry=REGISTRY)


async def count_status(db: StateDB, status: str) -> int:
    counts = await taskward.reads.count_by_status(db)
    return counts[status]


async def test_four_worker_processes_drain_4000_tasks_exactly_once(
    db: StateDB, db_url: str
) -> None:
    total = 4000
    for _ in range(total):
        await submit(db, "noop", {})
    with workers([worker_argv(db_url, "--concurrency", "8", "--burst") for _ in range(4)]) as procs:
        await wait_until(lambda: _all_completed(db, total), timeout=240, what="4000 completions")
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    claimed_by: dict[str, int] = {}
    page, cursor = await taskward.list_tasks(db, limit=500)
    rows = list(page)
    while cursor:
        page, cursor = await taskward.list_tasks(db, limit=500, cursor=cursor)
        rows += page
    assert len(rows) == total
    for row in rows:
        facts = await taskward.list_transitions(db, row["id"])
        # none started twice while its lease was valid, exactly one terminal transition
        assert [f["status"] for f in facts] == ["running", "completed"], row["id"]
        assert facts[0]["lease_id"] == facts[1]["lease_id"]
        claimed_by[row["leased_by"]] = claimed_by.get(row["leased_by"], 0) + 1
        events = await taskward.list_task_events(db, row["id"])
        assert len(events) == 2
    assert len(claimed_by) >= 2, claimed_by  # the work really was shared


async def _all_completed(db: StateDB, total: int) -> bool:
    return await count_status(db, "completed") == total


async def test_sigkilled_workers_task_is_recovered_by_another_worker(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "first-attempt"
    task_id = await submit(db, "hang_first", {"marker": str(marker), "timeout_s": 1.0})
    short = ["--lease-ttl", "0.5", "--lease-slack", "0.2"]
    with workers([worker_argv(db_url, *short)]) as [victim]:
        await wait_until(lambda: _exists(marker), timeout=30, what="the first attempt to start")
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        row = await taskward.get_task(db, task_id)
        assert row["status"] == "running" and row["lease_attempts"] == 1
        with workers([worker_argv(db_url, *short)]):
            await wait_until(
                lambda: _status_is(db, task_id, "completed"),
                timeout=30,
                what="recovery and completion",
            )
    facts = await taskward.list_transitions(db, task_id)
    assert [f["status"] for f in facts] == [
        "running",
        "retry_wait",
        "queued",
        "running",
        "completed",
    ]
    assert facts[1]["reason_code"] == "lease_expired"
    assert facts[0]["lease_id"] != facts[3]["lease_id"]
    assert (await taskward.get_task(db, task_id))["lease_attempts"] == 2


async def test_sigstopped_worker_resumed_after_reclaim_has_its_terminal_write_rejected(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    task_id = await submit(
        db, "nap_marked", {"marker": str(marker), "seconds": 0.6, "timeout_s": 1.0}
    )
    short = ["--lease-ttl", "0.5", "--lease-slack", "0.2"]
    with workers([worker_argv(db_url, *short, "--worker-id", "host:5709ed00")]) as [stopped]:
        await wait_until(lambda: _exists(marker), timeout=30, what="the first attempt to start")
        await _freeze_outside_write_lock(stopped, db_url)
        marker.unlink()
        with workers([worker_argv(db_url, *short, "--worker-id", "host:0be00001")]):
            await wait_until(
                lambda: _status_is(db, task_id, "completed"),
                timeout=30,
                what="reclaim and completion by the second worker",
            )
            os.killpg(stopped.pid, signal.SIGCONT)
            # the resumed worker finishes its stale attempt and tries to acknowledge it
            await wait_until(
                lambda: _stale_attempt_settled(db, task_id),
                timeout=30,
                what="the stale owner's attempt to settle",
            )
        os.killpg(stopped.pid, signal.SIGTERM)
        _, err = stopped.communicate(timeout=30)
    facts = await taskward.list_transitions(db, task_id)
    assert [f["status"] for f in facts] == [
        "running",
        "retry_wait",
        "queued",
        "running",
        "completed",
    ]
    assert [
        f["lease_id"] for f in facts if f["status"] in {"completed", "failed", "timed_out"}
    ] == ["host:0be00001/2"]
    assert "acknowledgements rejected 1" in err, err


async def _freeze_outside_write_lock(proc: subprocess.Popen[str], db_url: str) -> None:
    """SIGSTOP ``proc``'s process group at a moment it holds no SQLite write lock.

    SQLite has one write lock per database file: a process frozen inside a write transaction
    (a lease renewal, a heartbeat) blocks every other writer until it resumes. That is SQLite's
    nature, not a taskward guarantee (docs/faults.md), and not what this scenario is about, so
    on SQLite the worker is resumed and frozen again until a probe finds the lock free.
    PostgreSQL has no such lock: a frozen session's row locks cover only rows it is writing.
    """
    path = db_url.split("?", 1)[0][len("sqlite:///") :] if db_url.startswith("sqlite") else ""
    for _ in range(200):
        os.killpg(proc.pid, signal.SIGSTOP)
        if not path or _write_lock_free(path):
            return
        os.killpg(proc.pid, signal.SIGCONT)
        await asyncio.sleep(0.005)  # let it finish the transaction it is in
    raise AssertionError("the worker held the SQLite write lock at every one of 200 freezes")


def _write_lock_free(path: str) -> bool:
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


async def _stale_attempt_settled(db: StateDB, task_id: str) -> bool:
    row = await db.fetchone("worker_get", {"worker_id": "host:5709ed00"})
    # The stale worker heartbeats again once resumed; by then its job has been acknowledged
    # (and rejected): it no longer reports the task as leased.
    return (
        row is not None
        and row["leased_run_id"] is None
        and time.time() - row["last_heartbeat_at"] < 1.0
    )


async def _exists(path: Path) -> bool:
    return path.exists()


async def _status_is(db: StateDB, task_id: str, status: str) -> bool:
    return (await taskward.get_task(db, task_id))["status"] == status


async def test_a_worker_process_runs_with_its_collector_tuned(db: StateDB, db_url: str) -> None:
    """`taskward worker` freezes what start-up made and raises the collector's first threshold
    (cli.common.tune_gc) and runs on uvloop (cli.common.new_event_loop); the task function
    reports what it finds in its own process."""
    import ast

    from taskward.cli.common import GC_FIRST_THRESHOLD

    task_id = await submit(db, "gc_state", {})
    with workers([worker_argv(db_url, "--burst")]) as [proc]:
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    facts = await taskward.list_transitions(db, task_id)
    assert facts[-1]["status"] == "completed"
    [returned] = [e["repr"] for e in facts[-1]["evidence_refs"] if e["kind"] == "return_value"]
    state = ast.literal_eval(returned)
    assert state["first_threshold"] == GC_FIRST_THRESHOLD
    assert state["frozen"] > 10_000
    assert state["loop"].startswith("uvloop."), state["loop"]
