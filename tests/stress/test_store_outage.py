"""The store under stress, in one process (issue 8 item 4): a store that is away, locked or
flapping is retried with backoff and never becomes a task failure or a lost admission, and the
HTTP API answers 503 with Retry-After meanwhile -- never a 500, never a 2xx whose row is missing.

Real stores only: SQLite locked by another connection past the store's lock budget, and a
private PostgreSQL cluster stopped, started and with its sessions terminated.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg_pool import PoolClosed, PoolTimeout

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.checker import assert_invariants
from taskward.errors import StoreError, StoreUnavailable, TaskValidationError
from taskward.execution import RetryPolicy
from taskward.host.models import SessionSummary
from taskward.host.summaries import LocalSummaryStore
from taskward.http import HttpConfig, create_app
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.postgres.db import translate_error
from taskward.store.retry import outage_backoff, retry_while_unavailable
from taskward.store.sqlite.db import translate_error as sqlite_translate_error
from tests.stress.conftest import Outage

T = TypeVar("T")

REGISTRY = build_registry(
    AdapterConfig(
        imports=("tests.stress.tasks", "tests.integration.worker_tasks"),
        command_allowlist=frozenset({"echo"}),
    )
)
PROBLEM = "application/problem+json"
ECHO = {"action_kind": "command", "args": {"argv": ["echo", "hi"]}}


async def reading(op: Callable[[], Awaitable[T]]) -> T:
    """The test's own store calls ride out the outages too."""
    return await retry_while_unavailable(op, what="test read", logger=None)


async def wait_until(check: Callable[[], Awaitable[bool]], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def status_of(db: taskward.StateDB, task_id: str) -> str:
    row = await reading(lambda: taskward.get_task(db, task_id))
    return str(row["status"])


async def submit(db: taskward.StateDB, kind: str, args: dict[str, Any]) -> str:
    app = taskward.TaskApplication(
        action_kind=kind, args=args, execution_target="host", idempotency_key=f"k-{uuid.uuid4()}"
    )
    return await reading(lambda: taskward.submit_task(db, app, registry=REGISTRY))


async def holds(condition: Callable[[], bool]) -> bool:
    return condition()


def logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


# -- what is transient ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        pg_errors.AdminShutdown("terminating connection due to administrator command"),
        pg_errors.CrashShutdown("terminating connection because of crash of another process"),
        pg_errors.CannotConnectNow("the database system is starting up"),
        pg_errors.SerializationFailure("could not serialize access"),
        pg_errors.DeadlockDetected("deadlock detected"),
        pg_errors.ConnectionFailure("connection failure"),
        pg_errors.TooManyConnections("sorry, too many clients already"),
        pg_errors.LockNotAvailable("could not obtain lock"),
        psycopg.OperationalError("consuming input failed: server closed the connection"),
        psycopg.OperationalError("connection failed: Connection refused"),
        PoolTimeout("couldn't get a connection after 1.00 sec"),
    ],
    ids=lambda e: type(e).__name__ + (f"-{e.sqlstate}" if e.sqlstate else ""),
)
def test_transient_postgres_errors_are_store_unavailable(error: psycopg.Error) -> None:
    translated = translate_error(error)
    assert isinstance(translated, StoreUnavailable)
    assert "PostgreSQL unavailable, retry later" in str(translated)
    if error.sqlstate:
        assert f"SQLSTATE {error.sqlstate}" in str(translated)


@pytest.mark.parametrize(
    "error",
    [
        pg_errors.UniqueViolation("duplicate key"),
        pg_errors.SyntaxError("syntax error"),
        pg_errors.ProgramLimitExceeded("index row size exceeds maximum"),
        pg_errors.RaiseException("status_transitions is append-only"),
        PoolClosed("the pool is closed"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_other_postgres_errors_are_not_retried(error: psycopg.Error) -> None:
    translated = translate_error(error)
    assert isinstance(translated, StoreError) and not isinstance(translated, StoreUnavailable)


def test_sqlite_lock_and_io_errors_are_store_unavailable_and_others_are_not(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    errors: dict[str, sqlite3.Error] = {}
    try:
        other.execute("INSERT INTO t VALUES (1)")
    except sqlite3.Error as exc:
        errors["busy"] = exc
    try:
        sqlite3.connect(tmp_path / "missing" / "y.db").execute("SELECT 1")
    except sqlite3.Error as exc:
        errors["cantopen"] = exc
    try:
        other.execute("SELECT * FROM nope")
    except sqlite3.Error as exc:
        errors["error"] = exc
    holder.execute("ROLLBACK")
    assert isinstance(sqlite_translate_error(errors["busy"], str(path)), StoreUnavailable)
    assert "SQLITE_BUSY" in str(sqlite_translate_error(errors["busy"], str(path)))
    assert isinstance(sqlite_translate_error(errors["cantopen"], "y.db"), StoreUnavailable)
    plain = sqlite_translate_error(errors["error"], str(path))
    assert isinstance(plain, StoreError) and not isinstance(plain, StoreUnavailable)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///never.db?lock_timeout_s=0",
        "sqlite:///never.db?lock_timeout_s=soon",
        "postgresql://postgres@127.0.0.1:1/never?reconnect_timeout_s=-1",
    ],
)
async def test_bad_store_timeouts_in_a_url_are_validation_errors(url: str) -> None:
    with pytest.raises(TaskValidationError, match="a positive number of seconds"):
        await taskward.open_db(url)


def test_backoff_grows_to_its_cap_with_jitter_in_the_upper_half() -> None:
    backoff = outage_backoff(base_s=0.1, cap_s=1.0)
    assert [backoff.delay(n, rng=lambda: 1.0) for n in (1, 2, 3, 4, 5, 9)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )
    assert backoff.delay(3, rng=lambda: 0.0) == pytest.approx(0.2)


async def test_retry_gives_up_after_its_budget_and_passes_other_errors_at_once() -> None:
    calls = 0

    async def away() -> None:
        nonlocal calls
        calls += 1
        raise StoreUnavailable("away")

    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await retry_while_unavailable(
            away, what="x", backoff=outage_backoff(base_s=0.01, cap_s=0.02), budget_s=0.2
        )
    assert calls >= 5 and time.monotonic() - started < 1.0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise StoreError("bad SQL")

    calls = 0
    with pytest.raises(StoreError, match="bad SQL"):
        await retry_while_unavailable(broken, what="x")
    assert calls == 1


# -- a store that is away ------------------------------------------------------------------


async def test_a_locked_sqlite_store_is_store_unavailable_and_nothing_is_half_admitted(
    tmp_path: Path,
) -> None:
    outage = Outage("sqlite", "", sqlite_path=tmp_path / "locked.db")
    url = f"sqlite:///{outage.sqlite_path}?lock_timeout_s=0.2"
    app = taskward.TaskApplication(
        action_kind="noop", args={}, execution_target="host", idempotency_key="locked-key"
    )
    async with taskward.open_db(url) as db:
        await asyncio.to_thread(outage.begin)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"stayed locked .* 0\.2s"):
                await taskward.submit_task(db, app, registry=REGISTRY)
            assert 0.2 <= time.monotonic() - started < 2.0
            assert (await taskward.list_tasks(db))[0] == []  # WAL: readers are not blocked
        finally:
            await asyncio.to_thread(outage.end)
        task_id = await taskward.submit_task(db, app, registry=REGISTRY)
        assert await taskward.submit_task(db, app, registry=REGISTRY) == task_id
        assert len((await taskward.list_tasks(db))[0]) == 1


class OutageAfterSummary:
    """The host's SummaryStore, with a fault at one commit boundary: once armed, the store goes
    away right after the next summary commits, before the host acknowledges completion."""

    def __init__(self, inner: LocalSummaryStore, outage: Outage) -> None:
        self.inner = inner
        self.outage = outage
        self.armed = False

    async def write(self, session_key: str, summary: SessionSummary) -> None:
        await self.inner.write(session_key, summary)
        if self.armed:
            self.armed = False
            await asyncio.to_thread(self.outage.begin)

    async def mark_pending(self, session_key: str, reason: str) -> None:
        await self.inner.mark_pending(session_key, reason)


async def test_an_outage_at_summary_or_acknowledgement_fails_no_task(
    outage: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="taskward.store.retry")
    config = WorkerConfig(
        concurrency=2,
        heartbeat_interval_s=0.2,
        reap_interval_s=0.1,
        idle_wait_s=30.0,  # only a wake-up can make an idle worker claim promptly
        retry_policy=RetryPolicy(base_s=0.01),
        deliver_outbox=False,
        run_scheduler=False,
    )
    async with taskward.open_db(outage.url) as db, taskward.open_db(outage.url) as worker_db:
        runtime = WorkerRuntime(worker_db, REGISTRY, config)
        summaries = OutageAfterSummary(runtime.summaries, outage)
        runtime.host.summaries = summaries
        run = asyncio.create_task(runtime.run())
        try:
            ids = []
            # summary, complete: the two-step finish (the wrapped summary store is not the one
            # the source writes into); finish: the worker's own one-step finish (summary,
            # completion and next lease in one transaction) with the store away when it runs.
            for step in ("summary", "complete", "finish"):
                if step == "finish":
                    runtime.host.summaries = runtime.summaries
                assert runtime.host.finishes_in_one_step == (step == "finish")
                started, go = tmp_path / f"{step}.started", tmp_path / f"{step}.go"
                task_id = await submit(db, "gate", {"started": str(started), "go": str(go)})
                ids.append(task_id)
                await wait_until(lambda s=started: holds(s.exists), timeout=15, what="start")
                if step in {"summary", "finish"}:  # away before the summary is written
                    await asyncio.to_thread(outage.begin)
                else:  # away after the summary committed, before the acknowledgement
                    summaries.armed = True
                go.touch()
                failure = f"task {task_id}: {step} failed (StoreUnavailable"
                await wait_until(
                    lambda f=failure: holds(lambda: logged(caplog, f)),
                    timeout=15,
                    what=f"the {step} to fail while the store is away",
                )
                if outage.backend == "sqlite":  # readable meanwhile: nothing failed the task
                    assert await status_of(db, task_id) == "running"
                await asyncio.to_thread(outage.end)
                await wait_until(
                    lambda t=task_id: _is(db, t, "completed"), timeout=30, what=f"{step} retried"
                )
            for task_id in ids:
                facts = await reading(lambda t=task_id: taskward.list_transitions(db, t))
                assert [f["status"] for f in facts] == ["running", "completed"]
            # A commit whose reply the outage cut off is visible in the store before the host,
            # retrying, hears that it applied (a replay): wait for the host's count too.
            stats = runtime.host.stats

            async def counted() -> bool:
                return stats.completed + stats.failed + stats.ack_rejected >= 3

            await wait_until(counted, timeout=15, what="the host to count every acknowledgement")
            assert (stats.completed, stats.failed, stats.ack_rejected) == (3, 0, 0)

            if outage.backend == "postgres":
                # The LISTEN connection came back after each outage, and a worker idle for
                # up to 30 s picks up new work through NOTIFY at once.
                await wait_until(
                    lambda: holds(lambda: getattr(worker_db, "listener_connects", 0) >= 4),
                    timeout=5,
                    what="the LISTEN connection to come back after the third outage",
                )
                await wait_until(
                    lambda: holds(lambda: runtime.host.active_count == 0), timeout=5, what="idle"
                )
                await asyncio.sleep(0.2)  # let the host go back to waiting for a wake-up
                began = time.monotonic()
                probe = await submit(db, "noop", {})
                await wait_until(lambda: _is(db, probe, "completed"), timeout=5, what="pickup")
                assert time.monotonic() - began < 3.0
        finally:
            runtime.request_stop()
            assert await asyncio.wait_for(run, 30) == 0
        await assert_invariants(db)


async def _is(db: taskward.StateDB, task_id: str, status: str) -> bool:
    return await status_of(db, task_id) == status


# -- the HTTP API while the store is away ---------------------------------------------------


def _client(url: str) -> httpx.AsyncClient:
    app = create_app(url, REGISTRY, HttpConfig())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


def _assert_503(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM)
    assert r.headers["retry-after"] == "5"
    body: dict[str, Any] = r.json()
    assert body["type"] == "urn:taskward:problem:store-unavailable"
    assert "retry later" in body["detail"] or "locked" in body["detail"], body
    return body


async def test_the_api_answers_503_with_retry_after_while_the_store_is_away(
    outage: Outage,
) -> None:
    async with _client(outage.url) as client:
        first = await client.post("/api/tasks", json=ECHO, headers={"Idempotency-Key": "a-1"})
        assert first.status_code == 201
        task_id = first.json()["task_id"]
        await asyncio.to_thread(outage.begin)
        try:
            _assert_503(
                await client.post("/api/tasks", json=ECHO, headers={"Idempotency-Key": "a-2"})
            )
            _assert_503(await client.post(f"/api/tasks/{task_id}/cancel", json={}))
            read = await client.get(f"/api/tasks/{task_id}")
            if outage.backend == "sqlite":
                assert read.status_code == 200  # WAL: a held write lock blocks no reader
            else:
                _assert_503(read)
                _assert_503(await client.get("/healthz"))
                _assert_503(await client.get("/api/tasks"))
        finally:
            await asyncio.to_thread(outage.end)
        # Back: the same key lands once, and its row is there.
        answers = []
        deadline = time.monotonic() + 15
        while True:
            r = await client.post("/api/tasks", json=ECHO, headers={"Idempotency-Key": "a-2"})
            answers.append(r.status_code)
            if r.status_code != 503 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert r.status_code == 201, answers
        assert set(answers) <= {201, 503}
        created = r.json()["task_id"]
        assert (await client.get(f"/api/tasks/{created}")).status_code == 200
        assert (await client.get("/healthz")).status_code == 200


async def test_no_admission_is_lost_while_the_store_flaps(outage: Outage) -> None:
    """For 2.5 s a client admits keys one after another and retries every 503 with its key
    while the store flaps (SQLite locked for 0.3 s at a time, PostgreSQL's sessions terminated
    every 0.1 s). Every 2xx names a row that exists, no answer is a 500, and every key is
    admitted exactly once."""
    keys: list[str] = []
    told: dict[str, str] = {}
    statuses: dict[int, int] = {}
    stop = threading.Event()

    def flapper() -> None:
        while not stop.is_set():
            outage.flap()
            stop.wait(0.1 if outage.backend == "postgres" else 0.15)

    async with _client(outage.url) as client:
        assert (await client.get("/healthz")).status_code == 200
        flapping = asyncio.create_task(asyncio.to_thread(flapper))
        try:
            until = time.monotonic() + 2.5
            while time.monotonic() < until or len(keys) < 20:
                key = f"flap-{len(keys)}"
                keys.append(key)
                for _ in range(400):
                    r = await client.post("/api/tasks", json=ECHO, headers={"Idempotency-Key": key})
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    if r.status_code in (200, 201):
                        told[key] = r.json()["task_id"]
                        await asyncio.sleep(0.01)  # a gap a lock holder can take
                        break
                    _assert_503(r)
                    await asyncio.sleep(0.02)
                else:
                    raise AssertionError(f"{key} never admitted: {statuses}")
        finally:
            stop.set()
            await flapping
    assert set(statuses) <= {200, 201, 503}, statuses
    assert statuses.get(503, 0) > 0, f"the store never went away: {statuses}"
    assert outage.count >= 3
    async with taskward.open_db(outage.url) as db:
        for key, task_id in told.items():
            row = await reading(lambda t=task_id: taskward.get_task(db, t))
            assert row["idempotency_key"] == key
        page, _ = await reading(lambda: taskward.list_tasks(db, limit=500))
        assert len(page) == len(keys)
        await assert_invariants(db, acknowledged=told)
