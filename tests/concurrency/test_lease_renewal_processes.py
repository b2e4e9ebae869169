"""Lease renewal with real worker processes (DESIGN.md R25), on both backends: a renewing worker
keeps a short lease alive past its first expiry while another worker's reaper runs, and once it
is SIGKILLed its task is back within ``lease_ttl`` + a reaper interval, then completed once by
the other worker; ``--renew`` with a lease too short to renew is refused.

The tests wait on database conditions with a generous timeout, never on a fixed sleep; the
measured recovery time is printed (``pytest -s``) and bounded with room for a loaded machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.store.port import StateDB
from tests.worker_procs import ROOT, wait_until, worker_argv, workers

MODULE = "tests.integration.worker_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))
TTL_S = 3.0  # the shortest lease --renew takes: renewed every second
REAP_INTERVAL_S = 0.1  # worker_argv's --reap-interval
# Room for a loaded two-core machine (interpreters starting, other suites running) on top of
# the bound itself; the printed figure is the measurement.
LOAD_SLACK_S = 5.0
RENEWING = ("--lease-ttl", str(TTL_S), "--renew")

pytestmark = pytest.mark.slow


async def submit(db: StateDB, kind: str, args: dict[str, object]) -> str:
    app = taskward.TaskApplication(
        action_kind=kind, args=args, execution_target="host", idempotency_key=f"k-{uuid.uuid4()}"
    )
    return await taskward.submit_task(db, app, registry=REGISTRY)


async def test_a_sigkilled_renewing_workers_task_is_back_within_ttl_and_a_reaper_interval(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "first-attempt"
    # The first attempt hangs for a minute under a ten-minute deadline: without renewal its
    # lease would cover the deadline (R5) and a crash would strand it for ten minutes.
    task_id = await submit(
        db, "hang_first", {"marker": str(marker), "seconds": 60.0, "timeout_s": 600.0}
    )
    holder_id, rescuer_id = "host:aaaaaaaa", "host:bbbbbbbb"
    with workers([worker_argv(db_url, *RENEWING, "--worker-id", holder_id)]) as [holder]:
        await wait_until(lambda: _exists(marker), timeout=60, what="the first attempt to start")
        first = await taskward.get_task(db, task_id)
        assert (first["leased_by"], first["lease_attempts"]) == (holder_id, 1)
        assert first["lease_expires_at"] < first["deadline_at"]  # R25: the ttl, not the deadline
        with workers([worker_argv(db_url, *RENEWING, "--worker-id", rescuer_id)]) as [rescuer]:
            await wait_until(
                lambda: _heartbeating(db, rescuer_id), timeout=60, what="the rescuer to start"
            )
            # The rescuer's reaper runs every 0.1 s: past the expiry the holder's claim granted,
            # the task is still the holder's first attempt, its lease renewed.
            await wait_until(
                lambda: _store_time_past(db, first["lease_expires_at"] + 1.0),
                timeout=60,
                what="the store clock to pass the claim's expiry",
            )
            renewed = await taskward.get_task(db, task_id)
            assert (renewed["status"], renewed["leased_by"], renewed["lease_attempts"]) == (
                "running",
                holder_id,
                1,
            )
            assert renewed["lease_expires_at"] > first["lease_expires_at"]

            os.killpg(holder.pid, signal.SIGKILL)
            killed = time.monotonic()
            holder.wait(timeout=30)
            last_expiry = (await taskward.get_task(db, task_id))["lease_expires_at"]
            await wait_until(
                lambda: _out_of_holders_lease(db, task_id, holder_id),
                timeout=60,
                what="the killed holder's task to be recovered",
            )
            recovered_s = time.monotonic() - killed
            await wait_until(
                lambda: _status_is(db, task_id, "completed"),
                timeout=60,
                what="the rescuer to complete the task",
            )
            rescuer.send_signal(signal.SIGTERM)
    facts = await taskward.list_transitions(db, task_id)
    assert [f["status"] for f in facts] == [
        "running",
        "retry_wait",
        "queued",
        "running",
        "completed",
    ]
    reaped = facts[1]
    assert reaped["reason_code"] == "lease_expired"
    assert [f["lease_id"] for f in facts if f["status"] == "completed"] == [f"{rescuer_id}/2"]
    # On the store's clock: the reaper moved the row within a reaper interval (and load) of the
    # expiry of the last renewal the holder made; and that expiry was at most a ttl after the
    # kill. On the test's clock: kill to recovery within ttl + reaper interval (and load).
    late_s = reaped["created_at"] - last_expiry
    print(
        f"\n[{db.dialect}] SIGKILL -> recovered in {recovered_s:.2f} s (lease_ttl {TTL_S:g} s, "
        f"reaper every {REAP_INTERVAL_S:g} s); reaped {late_s:.3f} s after the lease's expiry"
    )
    assert 0.0 < late_s <= REAP_INTERVAL_S + LOAD_SLACK_S, late_s
    assert recovered_s <= TTL_S + REAP_INTERVAL_S + LOAD_SLACK_S, recovered_s


def test_renew_with_a_lease_too_short_to_renew_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    url = f"sqlite:///{tmp_path / 'tw.db'}"
    worker = ["worker", "--renew", "--lease-ttl", "2", "--burst"]
    proc = subprocess.run(
        [sys.executable, "-m", "taskward.cli.main", "--db", url, *worker],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--lease-ttl" in proc.stderr and "too short to renew" in proc.stderr
    assert "at least 3 s" in proc.stderr
    assert "Traceback" not in proc.stderr


async def _exists(path: Path) -> bool:
    return path.exists()


async def _heartbeating(db: StateDB, worker_id: str) -> bool:
    return await db.fetchone("worker_get", {"worker_id": worker_id}) is not None


async def _store_time_past(db: StateDB, at: float) -> bool:
    return await db.now() > at


async def _out_of_holders_lease(db: StateDB, task_id: str, holder_id: str) -> bool:
    row = await taskward.get_task(db, task_id)
    return (row["status"], row["leased_by"], row["lease_attempts"]) != ("running", holder_id, 1)


async def _status_is(db: StateDB, task_id: str, status: str) -> bool:
    return (await taskward.get_task(db, task_id))["status"] == status
