"""The notification outbox (ADR-0072 D6, R12) on both backends, time injected.

Enqueue: exactly one row per terminal transition, in the transition's transaction. Delivery:
pending -> delivering -> delivered | dead_letter | expired under the deliverer's own lease, with
backoff, operator retry and purge — and never a change to the task.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

import taskward
from taskward import Actor, StateReason, TransitionRequest
from taskward.canonical import canonical_json
from taskward.errors import (
    NotificationNotFound,
    NotificationNotRetryable,
    StoreError,
    TaskValidationError,
)
from taskward.outbox import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_TTL_S,
    OUTBOX_BACKOFF,
    Backoff,
    CommandTarget,
    DeliveryFailed,
    OutboxConfig,
    OutboxDeliverer,
    WebhookTarget,
    count_notifications,
    enqueue_notification,
    envelope,
    get_notification,
    list_notifications,
    purge_notifications,
    retry_notification,
)
from taskward.outbox.signing import webhook_headers
from taskward.outbox.targets import MAX_RESPONSE_BYTES
from taskward.reads import list_task_events
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import Row, StateDB
from tests.integration.helpers import REGISTRY, move, request, submit

T0 = 1_000_000.0
FLAT = Backoff(base_s=10.0, factor=2.0, cap_s=1000.0, jitter=0.0)
SECRET = "s3cret-for-tests"


@dataclass
class Recorder:
    """A delivery target that records payloads; fails its first ``fail_times`` attempts."""

    name: str = "rec"
    timeout_s: float = 5.0
    fail_times: int = 0
    payloads: list[dict[str, Any]] = field(default_factory=list)
    in_flight: set[str] = field(default_factory=set)
    overlaps: list[str] = field(default_factory=list)
    delivered: asyncio.Event = field(default_factory=asyncio.Event)

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
        if row["id"] in self.in_flight:
            self.overlaps.append(str(row["id"]))
        self.in_flight.add(row["id"])
        try:
            await asyncio.sleep(0)  # let racing deliverers interleave
            if self.fail_times > 0:
                self.fail_times -= 1
                raise DeliveryFailed("receiver said no")
            self.payloads.append(json.loads(payload))
            self.delivered.set()
        finally:
            self.in_flight.discard(row["id"])


def deliverer(
    db: StateDB, *targets: Any, owner: str = "deliverer-a", **config: Any
) -> OutboxDeliverer:
    config.setdefault("backoff", FLAT)
    return OutboxDeliverer(db, OutboxConfig(targets=tuple(targets), **config), owner=owner)


async def outbox_rows(db: StateDB, task_id: str | None = None) -> list[Row]:
    rows, _ = await list_notifications(db, task_id=task_id, limit=500)
    return rows


async def one_row(db: StateDB, task_id: str) -> Row:
    rows = await outbox_rows(db, task_id)
    assert len(rows) == 1, rows
    return rows[0]


async def snapshot(db: StateDB, task_id: str) -> bytes:
    """The task's row, facts and events as bytes: delivery must leave them identical."""
    row = await taskward.get_task(db, task_id)
    facts = await taskward.list_transitions(db, task_id)
    events = await list_task_events(db, task_id)
    return canonical_json([row, facts, events]).encode()


async def terminal_task(db: StateDB, *path: str, now: float = T0) -> str:
    task_id = await submit(db, now=now)
    await move(db, task_id, *path, now=now)
    return task_id


# -- enqueue: one row per terminal transition, atomically -------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        ("queued", "skipped"),
        ("queued", "cancelled"),
        ("queued", "running", "completed"),
        ("queued", "running", "failed"),
        ("queued", "running", "timed_out"),
        ("queued", "running", "retry_wait", "cancelled"),
        ("queued", "waiting_dependency", "skipped"),
    ],
    ids=lambda path: "-".join(path),
)
async def test_a_terminal_transition_enqueues_exactly_one_notification(
    db: StateDB, path: tuple[str, ...]
) -> None:
    task_id = await terminal_task(db, *path)
    row = await one_row(db, task_id)
    last = (await taskward.list_transitions(db, task_id))[-1]
    assert row["kind"] == "task_terminal"
    assert row["dedup_key"] == f"task-terminal:{last['id']}"
    assert row["transition_id"] == last["id"] and row["schedule_run_id"] == task_id
    assert row["body"] == {
        "status": path[-1],
        "reason": {"code": "operator", "summary": ""},
        "evidence_refs": [],
    }
    assert row["status"] == "pending" and row["attempts"] == 0
    assert row["next_attempt_at"] == T0 and row["created_at"] == T0
    # The SQL defaults of outbox_enqueue agree with taskward.outbox's constants.
    assert row["max_attempts"] == DEFAULT_MAX_ATTEMPTS
    assert row["expires_at"] == T0 + DEFAULT_TTL_S


async def test_non_terminal_transitions_enqueue_nothing(db: StateDB) -> None:
    task_id = await terminal_task(db, "queued", "running", "retry_wait", "queued", "running")
    assert await outbox_rows(db, task_id) == []


async def test_the_body_carries_the_reason_and_evidence(db: StateDB) -> None:
    task_id = await submit(db, now=T0)
    await move(db, task_id, "queued", "running", now=T0)
    evidence = [{"kind": "process", "exit_code": 3}]
    result = await taskward.transition_task(
        db,
        TransitionRequest(
            entity_id=task_id,
            from_state="running",
            to_state="failed",
            reason=StateReason(
                code="execution_failed", summary="exit code 3", evidence_refs=evidence
            ),
            actor=Actor(type="system", id="test"),
            idempotency_key="fail-1",
        ),
        now=T0 + 1,
    )
    row = await one_row(db, task_id)
    assert row["transition_id"] == result.transition_id
    assert row["body"] == {
        "status": "failed",
        "reason": {"code": "execution_failed", "summary": "exit code 3"},
        "evidence_refs": evidence,
    }


async def test_a_replayed_or_losing_transition_enqueues_nothing_more(db: StateDB) -> None:
    task_id = await submit(db, now=T0)
    skip = request(task_id, "queued", "skipped", key="skip-once")
    first = await taskward.transition_task(db, skip, now=T0)
    replay = await taskward.transition_task(db, skip, now=T0 + 1)
    assert first.applied and replay.replayed
    lost = await taskward.transition_task(db, request(task_id, "queued", "cancelled"), now=T0 + 2)
    assert lost.conflict
    row = await one_row(db, task_id)
    assert row["transition_id"] == first.transition_id


async def test_the_worker_and_cancellation_paths_enqueue_too(db: StateDB) -> None:
    ran = await submit(db, now=T0)
    counts = await taskward.worker_tick(db, worker_id="host:0000000a", registry=REGISTRY, now=T0)
    assert counts["executed"] == 1
    assert (await one_row(db, ran))["body"]["status"] == "completed"
    cancelled = await submit(db, now=T0)
    await taskward.request_task_cancel(
        db, cancelled, actor=Actor(type="operator", id="t"), idempotency_key="c-1", now=T0
    )
    assert (await one_row(db, cancelled))["body"]["reason"]["code"] == "cancelled"


async def _break_outbox(db: StateDB, db_url: str, *, broken: bool) -> None:
    if db.dialect == "sqlite":
        with sqlite3.connect(db_url[len("sqlite:///") :]) as conn:
            if broken:
                conn.execute(
                    "CREATE TRIGGER outbox_down BEFORE INSERT ON dispatch_outbox "
                    "BEGIN SELECT RAISE(ABORT, 'outbox down'); END"
                )
            else:
                conn.execute("DROP TRIGGER outbox_down")
        return
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        if broken:
            await conn.execute(
                "CREATE FUNCTION outbox_down() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'outbox down'; END $$"
            )
            await conn.execute(
                "CREATE TRIGGER outbox_down BEFORE INSERT ON dispatch_outbox "
                "FOR EACH ROW EXECUTE FUNCTION outbox_down()"
            )
        else:
            await conn.execute("DROP TRIGGER outbox_down ON dispatch_outbox")


async def test_a_failed_enqueue_rolls_back_its_transition(db: StateDB, db_url: str) -> None:
    task_id = await submit(db, now=T0)
    before = await snapshot(db, task_id)
    await _break_outbox(db, db_url, broken=True)
    with pytest.raises((StoreError, sqlite3.Error), match="outbox down"):
        await taskward.transition_task(db, request(task_id, "queued", "skipped"), now=T0)
    assert await snapshot(db, task_id) == before  # no status, no fact, no event
    assert await outbox_rows(db) == []
    await _break_outbox(db, db_url, broken=False)
    await move(db, task_id, "queued", "skipped", now=T0)
    assert len(await outbox_rows(db, task_id)) == 1


async def test_enqueue_notification_is_deduplicated_by_key(db: StateDB) -> None:
    body = {"hello": "world"}
    assert await enqueue_notification(db, kind="custom", dedup_key="k1", body=body, now=T0)
    assert not await enqueue_notification(db, kind="custom", dedup_key="k1", body={}, now=T0)
    (row,) = await outbox_rows(db)
    assert row["body"] == body and row["schedule_run_id"] is None
    with pytest.raises(TaskValidationError, match="max_attempts"):
        await enqueue_notification(db, kind="c", dedup_key="k2", body={}, max_attempts=0)


# -- the deliverer ----------------------------------------------------------------------------


async def test_a_delivery_is_acknowledged_with_the_envelope(db: StateDB) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    rec = Recorder()
    counts = await deliverer(db, rec).run_once(now=T0 + 1)
    assert counts["claimed"] == 1 and counts["delivered"] == 1
    row = await one_row(db, task_id)
    assert row["status"] == "delivered" and row["delivered_at"] == T0 + 1
    assert row["attempts"] == 1 and row["acked_targets"] == ["rec"]
    assert row["lease_owner"] is None and row["lease_expires_at"] is None
    assert rec.payloads == [
        {
            "id": row["id"],
            "kind": "task_terminal",
            "dedup_key": row["dedup_key"],
            "task_id": task_id,
            "transition_id": row["transition_id"],
            "created_at": T0,
            "body": row["body"],
        }
    ]
    assert (await deliverer(db, rec).run_once(now=T0 + 2))["claimed"] == 0


async def test_failed_attempts_back_off_exponentially(db: StateDB) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    rec = Recorder(fail_times=2)
    d = deliverer(db, rec)
    assert (await d.run_once(now=T0))["failed"] == 1
    row = await one_row(db, task_id)
    assert row["status"] == "pending" and row["attempts"] == 1
    assert row["next_attempt_at"] == T0 + 10
    assert row["last_error"] == "rec: receiver said no"
    assert (await d.run_once(now=T0 + 9.9))["claimed"] == 0  # not due yet
    assert (await d.run_once(now=T0 + 10))["failed"] == 1
    assert (await one_row(db, task_id))["next_attempt_at"] == T0 + 10 + 20
    assert (await d.run_once(now=T0 + 30))["delivered"] == 1
    assert (await one_row(db, task_id))["attempts"] == 3


def test_backoff_is_capped_and_jittered_within_bounds() -> None:
    import random

    rng = random.Random(7)
    policy = Backoff(base_s=10.0, factor=2.0, cap_s=100.0, jitter=0.2)
    for attempt, nominal in [(1, 10.0), (2, 20.0), (3, 40.0), (5, 100.0), (500, 100.0)]:
        delays = [policy.delay(attempt, rng.random) for _ in range(200)]
        assert all(0.8 * nominal <= d <= 1.2 * nominal for d in delays)
        assert len(set(delays)) > 1  # jitter spreads retries
    # the outbox's own: 10 s after the first failed attempt (the one Backoff of the registry)
    assert dataclasses.replace(OUTBOX_BACKOFF, jitter=0.0).delay(1, rng.random) == 10.0
    assert Backoff is taskward.Backoff


async def test_dead_letter_after_completed_leaves_the_task_completed(db: StateDB) -> None:
    task_id = await submit(db, now=T0)
    await taskward.worker_tick(db, worker_id="host:0000000b", registry=REGISTRY, now=T0)
    before = await snapshot(db, task_id)
    d = deliverer(db, Recorder(fail_times=100), backoff=Backoff(base_s=1.0, factor=1.0, jitter=0))
    outcomes = [await d.run_once(now=T0 + i) for i in range(DEFAULT_MAX_ATTEMPTS + 2)]
    assert sum(c["failed"] for c in outcomes) == DEFAULT_MAX_ATTEMPTS - 1
    assert sum(c["dead_letter"] for c in outcomes) == 1
    row = await one_row(db, task_id)
    assert row["status"] == "dead_letter" and row["attempts"] == DEFAULT_MAX_ATTEMPTS
    assert (await taskward.get_task(db, task_id))["status"] == "completed"
    assert await snapshot(db, task_id) == before


async def test_operator_retry_after_cancelled_delivers_and_leaves_the_task_alone(
    db: StateDB,
) -> None:
    task_id = await terminal_task(db, "queued", "cancelled")
    before = await snapshot(db, task_id)
    row = await one_row(db, task_id)
    rec = Recorder(fail_times=DEFAULT_MAX_ATTEMPTS)
    d = deliverer(db, rec, backoff=Backoff(base_s=1.0, factor=1.0, jitter=0))
    for i in range(DEFAULT_MAX_ATTEMPTS):
        await d.run_once(now=T0 + i)
    assert (await get_notification(db, row["id"]))["status"] == "dead_letter"
    retried = await retry_notification(db, row["id"], now=T0 + 100)
    assert retried["status"] == "pending" and retried["attempts"] == 0
    assert retried["next_attempt_at"] == T0 + 100
    assert retried["expires_at"] == T0 + 100 + DEFAULT_TTL_S
    assert retried["last_error"] == "rec: receiver said no"  # kept for the operator
    assert (await d.run_once(now=T0 + 100))["delivered"] == 1
    assert len(rec.payloads) == 1
    with pytest.raises(NotificationNotRetryable, match="delivered"):
        await retry_notification(db, row["id"], now=T0 + 101)
    with pytest.raises(NotificationNotFound):
        await retry_notification(db, "no-such-id")
    assert (await taskward.get_task(db, task_id))["status"] == "cancelled"
    assert await snapshot(db, task_id) == before


async def test_rows_expire_after_expires_at_and_an_operator_may_retry_them(db: StateDB) -> None:
    await enqueue_notification(db, kind="custom", dedup_key="e1", body={}, ttl_s=100, now=T0)
    idle = deliverer(db)  # no target: nothing is claimed, but expiry still runs
    assert (await idle.run_once(now=T0 + 100))["expired"] == 0  # expires_at < now, strictly
    counts = await idle.run_once(now=T0 + 100.5)
    assert counts["expired"] == 1 and counts["claimed"] == 0
    (row,) = await outbox_rows(db)
    assert row["status"] == "expired" and row["last_error"] == "expired before delivery"
    rec = Recorder()
    assert (await deliverer(db, rec).run_once(now=T0 + 200))["claimed"] == 0
    await retry_notification(db, row["id"], ttl_s=50, now=T0 + 200)
    assert (await deliverer(db, rec).run_once(now=T0 + 200))["delivered"] == 1


async def test_an_attempt_ending_past_expiry_expires_the_row(db: StateDB) -> None:
    for key in ("fails-late", "lease-expires-late"):
        await enqueue_notification(db, kind="c", dedup_key=key, body={}, ttl_s=100, now=T0)
    claimed = {r["dedup_key"]: r for r in await _claim_as(db, "d", now=T0 + 100)}
    async with db.transaction(now=T0 + 101) as tx:
        failed = await tx.fetchone(
            "outbox_fail",
            {
                "id": claimed["fails-late"]["id"],
                "owner": "d",
                "attempts": 1,
                "acked_targets": "[]",
                "error": "no",
                "delay_s": 10.0,
            },
        )
    assert failed == {"status": "expired"}
    counts = await deliverer(db, Recorder()).run_once(now=T0 + 161)
    assert counts["released"] == 1 and counts["expired"] == 1 and counts["claimed"] == 0
    assert {r["status"] for r in await outbox_rows(db)} == {"expired"}


async def test_with_no_target_configured_rows_stay_pending(db: StateDB) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    counts = await deliverer(db).run_once(now=T0 + 60)
    assert counts["claimed"] == 0
    row = await one_row(db, task_id)
    assert row["status"] == "pending" and row["attempts"] == 0


async def _claim_as(db: StateDB, owner: str, *, now: float, lease_s: float = 60.0) -> list[Row]:
    async with db.transaction(now=now) as tx:
        return await tx.fetchall(
            "outbox_claim_due", {"owner": owner, "lease_s": lease_s, "limit": 10}
        )


async def test_an_expired_deliverer_lease_returns_the_row_to_pending(db: StateDB) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    (claimed,) = await _claim_as(db, "crashed", now=T0)  # a deliverer that then died
    assert claimed["status"] == "delivering" and claimed["lease_expires_at"] == T0 + 60
    rec = Recorder()
    survivor = deliverer(db, rec, owner="survivor")
    assert (await survivor.run_once(now=T0 + 60))["claimed"] == 0  # lease still held
    assert rec.payloads == []
    counts = await survivor.run_once(now=T0 + 60.5)
    assert counts["released"] == 1 and counts["delivered"] == 1
    row = await one_row(db, task_id)
    assert row["status"] == "delivered" and row["attempts"] == 2
    assert "lease of crashed expired" in row["last_error"]
    # The crashed owner's late acknowledgement writes nothing: the lease is not its own.
    async with db.transaction(now=T0 + 61) as tx:
        late = await tx.fetchone(
            "outbox_ack",
            {"id": row["id"], "owner": "crashed", "attempts": 1, "acked_targets": "[]"},
        )
    assert late is None
    assert (await one_row(db, task_id))["delivered_at"] == T0 + 60.5


async def test_a_lease_expiring_at_the_ceiling_dead_letters(db: StateDB) -> None:
    await enqueue_notification(db, kind="c", dedup_key="ceil", body={}, max_attempts=1, now=T0)
    await _claim_as(db, "crashed", now=T0)
    counts = await deliverer(db, Recorder()).run_once(now=T0 + 61)
    assert counts["released"] == 1 and counts["dead_letter"] == 1 and counts["claimed"] == 0
    assert (await outbox_rows(db))[0]["status"] == "dead_letter"


async def test_a_deliverer_that_lost_its_lease_records_nothing(db: StateDB) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    rescuer_target = Recorder(name="rec")
    rescuer = deliverer(db, rescuer_target, owner="rescuer")

    @dataclass
    class Stalls:
        name: str = "rec"
        timeout_s: float = 5.0

        async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
            # While this deliverer stalls, its lease expires and another one takes over.
            counts = await rescuer.run_once(now=T0 + 1000)
            assert counts["released"] == 1 and counts["delivered"] == 1

    counts = await deliverer(db, Stalls(), owner="staller").run_once(now=T0)
    assert counts["lost"] == 1
    row = await one_row(db, task_id)
    assert row["status"] == "delivered" and row["delivered_at"] == T0 + 1000
    assert row["attempts"] == 2 and len(rescuer_target.payloads) == 1


async def test_several_deliverers_racing_never_deliver_a_row_twice(
    db: StateDB, db_url: str
) -> None:
    for _ in range(30):
        await terminal_task(db, "queued", "skipped")
    others = [await taskward.open_db(db_url) for _ in range(3)]
    rec = Recorder()
    try:
        racers = [
            deliverer(store, rec, owner=f"racer-{i}", batch_size=4, concurrency=2)
            for i, store in enumerate([db, *others])
        ]
        for _ in range(10):
            rounds = await asyncio.gather(*(r.run_once(now=T0 + 1) for r in racers))
            if not any(c["claimed"] for c in rounds):
                break
    finally:
        for store in others:
            await store.close()
    delivered = [p["id"] for p in rec.payloads]
    assert len(delivered) == len(set(delivered)) == 30
    assert rec.overlaps == []
    assert (await count_notifications(db))["delivered"] == 30


async def test_a_target_that_raises_is_one_failed_attempt(db: StateDB) -> None:
    @dataclass
    class Broken:
        name: str = "broken"
        timeout_s: float = 5.0

        async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
            raise RuntimeError("bug in a target")

    task_id = await terminal_task(db, "queued", "skipped")
    rec = Recorder()
    assert (await deliverer(db, rec, Broken()).run_once(now=T0))["failed"] == 1
    row = await one_row(db, task_id)
    assert row["last_error"] == "broken: RuntimeError: bug in a target"
    assert row["acked_targets"] == ["rec"]  # the healthy target is not sent it again
    assert (await deliverer(db, rec).run_once(now=T0 + 10))["delivered"] == 1
    assert len(rec.payloads) == 1


# -- purge ------------------------------------------------------------------------------------


async def test_purge_deletes_only_finished_rows(db: StateDB) -> None:
    for key, max_attempts in (("delivered", 5), ("dead", 1), ("delivering", 5)):
        await enqueue_notification(
            db, kind="c", dedup_key=key, body={}, max_attempts=max_attempts, now=T0
        )
    claimed = {r["dedup_key"]: r for r in await _claim_as(db, "d", now=T0)}
    assert set(claimed) == {"delivered", "dead", "delivering"}
    lease = {"owner": "d", "attempts": 1, "acked_targets": "[]"}
    async with db.transaction(now=T0) as tx:
        await tx.fetchone("outbox_ack", {**lease, "id": claimed["delivered"]["id"]})
        failed = await tx.fetchone(
            "outbox_fail", {**lease, "id": claimed["dead"]["id"], "error": "no", "delay_s": 0.0}
        )
    assert failed == {"status": "dead_letter"}
    await enqueue_notification(db, kind="c", dedup_key="expired", body={}, ttl_s=5, now=T0)
    await enqueue_notification(db, kind="c", dedup_key="pending", body={}, now=T0)
    task_id = await terminal_task(db, "queued", "skipped", now=T0)
    before = await snapshot(db, task_id)
    assert (await deliverer(db).run_once(now=T0 + 10))["expired"] == 1
    assert await count_notifications(db) == {
        "pending": 2,
        "delivering": 1,
        "delivered": 1,
        "dead_letter": 1,
        "expired": 1,
    }
    assert await purge_notifications(db, older_than_s=100, now=T0 + 50) == 0
    assert await purge_notifications(db, older_than_s=100, now=T0 + 200) == 3
    left = sorted(r["status"] for r in await outbox_rows(db))
    assert left == ["delivering", "pending", "pending"]
    assert await purge_notifications(db, older_than_s=0, now=T0 + 10_000) == 0
    assert await snapshot(db, task_id) == before  # R11: runs and facts stay
    with pytest.raises(TaskValidationError, match="older_than_s"):
        await purge_notifications(db, older_than_s=-1)


# -- webhooks ---------------------------------------------------------------------------------


class Receiver:
    """A loopback HTTP/1.1 receiver (keep-alive) answering POSTs with queued status codes
    (default 200) and ``answer`` as the body; it records each request and its client port."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.client_ports: list[int] = []
        self.statuses: list[int] = []
        self.answer = b""
        self.delay_s = 0.0
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                receiver.requests.append((self.command, self.path, dict(self.headers), body))
                receiver.client_ports.append(self.client_address[1])
                if receiver.delay_s:
                    receiver._release.wait(receiver.delay_s)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Set-Cookie", "session=from-the-receiver")
                self.send_header("Content-Length", str(len(receiver.answer)))
                self.end_headers()
                with contextlib.suppress(OSError):  # a client that stopped reading
                    self.wfile.write(receiver.answer)

            do_POST = _handle
            do_GET = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


async def test_a_webhook_receives_the_envelope_signed_the_standard_webhooks_way(
    db: StateDB, receiver: Receiver
) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    hook = WebhookTarget(url=receiver.url, secret=SECRET, timeout_s=5)
    async with deliverer(db, hook) as d:
        assert (await d.run_once(now=T0))["delivered"] == 1
    row = await one_row(db, task_id)
    ((method, path, headers, body),) = receiver.requests
    assert (method, path) == ("POST", "/hook")
    assert body == envelope(row)
    # The receiver's side: a published Standard Webhooks library verifies it. A plain secret
    # is the key's UTF-8 bytes.
    assert Webhook(SECRET.encode()).verify(body, headers) == json.loads(body)
    assert json.loads(body)["body"] == row["body"]
    assert headers["webhook-id"] == row["id"]
    assert headers["webhook-timestamp"].isdigit()
    assert headers["webhook-signature"].startswith("v1,")
    assert headers["X-Taskward-Event"] == "task_terminal"
    assert headers["X-Taskward-Attempt"] == "1"
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"] == "taskward-outbox"
    assert not {"X-Taskward-Signature", "X-Taskward-Timestamp", "X-Taskward-Delivery"} & set(
        headers
    )
    with pytest.raises(WebhookVerificationError):
        Webhook(b"another key").verify(body, headers)


async def test_a_tampered_body_or_an_old_timestamp_fails_verification(
    db: StateDB, receiver: Receiver
) -> None:
    await terminal_task(db, "queued", "skipped")
    hook = WebhookTarget(url=receiver.url, secret=SECRET, timeout_s=5)
    async with deliverer(db, hook) as d:
        assert (await d.run_once(now=T0))["delivered"] == 1
    ((_, _, headers, body),) = receiver.requests
    verifier = Webhook(SECRET.encode())
    tampered = body.replace(b'"skipped"', b'"completed"')
    assert tampered != body
    with pytest.raises(WebhookVerificationError, match="signature"):
        verifier.verify(tampered, headers)
    # The timestamp is signed: moving it forward breaks the signature...
    moved = {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)}
    with pytest.raises(WebhookVerificationError, match="signature"):
        verifier.verify(body, moved)
    # ...and a request signed ten minutes ago (a replay) is refused as too old.
    stale = WebhookTarget(url=receiver.url, secret=SECRET, clock=lambda: time.time() - 600)
    task_id = await terminal_task(db, "queued", "cancelled")
    async with deliverer(db, stale) as d:
        assert (await d.run_once(now=T0))["delivered"] == 1
    (_, _, old_headers, old_body) = receiver.requests[-1]
    assert json.loads(old_body)["task_id"] == task_id
    with pytest.raises(WebhookVerificationError, match="too old"):
        verifier.verify(old_body, old_headers)


async def test_the_receiver_example_in_the_docs_verifies_and_dedupes(
    db: StateDB, receiver: Receiver
) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "outbox.md").read_text()
    (example,) = (
        block
        for block in doc.split("```python\n")[1:]
        if block.startswith("from standardwebhooks import")
    )
    secret = "whsec_" + base64.b64encode(b"a key of thirty-two random bytes").decode()
    namespace: dict[str, Any] = {}
    exec(example.split("```")[0].replace('"whsec_..."', repr(secret)), namespace)
    await terminal_task(db, "queued", "skipped")
    async with deliverer(db, WebhookTarget(url=receiver.url, secret=secret)) as d:
        assert (await d.run_once(now=T0))["delivered"] == 1
    ((_, _, headers, body),) = receiver.requests
    handle = namespace["handle"]
    assert handle(body, headers) == 204
    assert handle(body, headers) == 200  # the same webhook-id again: a redelivery
    assert handle(body + b" ", headers) == 401


async def test_the_webhook_id_is_the_same_on_every_attempt(db: StateDB, receiver: Receiver) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    receiver.statuses = [503]
    async with deliverer(db, WebhookTarget(url=receiver.url, secret=SECRET)) as d:
        assert (await d.run_once(now=T0))["failed"] == 1
        assert (await d.run_once(now=T0 + 10))["delivered"] == 1
    first, second = (headers for _, _, headers, _ in receiver.requests)
    assert first["webhook-id"] == second["webhook-id"] == (await one_row(db, task_id))["id"]
    assert (first["X-Taskward-Attempt"], second["X-Taskward-Attempt"]) == ("1", "2")


def test_a_whsec_secret_is_the_standard_base64_key_and_never_shown() -> None:
    key = b"\x00\x01 a binary key \xff"
    secret = "whsec_" + base64.b64encode(key).decode()
    hook = WebhookTarget(url="https://example.invalid/hook", secret=secret)
    payload = b'{"id":"n1"}'
    headers = webhook_headers(hook._signer, "n1", int(time.time()), payload)
    Webhook(secret).verify(payload, headers)  # what a receiver given the whsec_ secret does
    Webhook(key).verify(payload, headers)
    assert secret not in repr(hook)
    with pytest.raises(TaskValidationError) as bad:
        WebhookTarget(url="https://example.invalid/hook", secret="whsec_not*base64!")
    assert "not*base64" not in str(bad.value)
    with pytest.raises(TaskValidationError):
        WebhookTarget(url="https://example.invalid/hook", secret="whsec_")


async def test_deliveries_reuse_one_connection_and_the_deliverer_closes_it(
    db: StateDB, receiver: Receiver
) -> None:
    for _ in range(3):
        await terminal_task(db, "queued", "skipped")
    hook = WebhookTarget(url=receiver.url, secret=SECRET)
    d = deliverer(db, hook, concurrency=1)
    assert (await d.run_once(now=T0))["delivered"] == 3
    await terminal_task(db, "queued", "cancelled")
    assert (await d.run_once(now=T0 + 1))["delivered"] == 1
    assert len(receiver.client_ports) == 4 and len(set(receiver.client_ports)) == 1
    # No cookie kept from one answer for the next delivery.
    assert all("Cookie" not in headers for _, _, headers, _ in receiver.requests)
    client = d._http
    assert client is not None and not client.is_closed
    await d.aclose()
    await d.aclose()
    assert client.is_closed
    await terminal_task(db, "queued", "cancelled")
    assert (await d.run_once(now=T0 + 2))["failed"] == 1  # a closed deliverer delivers no more


async def test_run_closes_the_http_client_when_it_returns(db: StateDB, receiver: Receiver) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "skipped")  # the store's clock: due now
    d = deliverer(db, WebhookTarget(url=receiver.url, secret=SECRET), poll_interval_s=0.05)
    runner = asyncio.create_task(d.run())
    await asyncio.wait_for(d.recorded.wait(), 10)
    client = d._http
    d.stop()
    await asyncio.wait_for(runner, 10)
    assert client is not None and client.is_closed
    assert (await one_row(db, task_id))["status"] == "delivered"


async def test_a_long_answer_is_not_read_past_its_bound(db: StateDB, receiver: Receiver) -> None:
    for _ in range(2):
        await terminal_task(db, "queued", "skipped")
    receiver.answer = b"x" * (MAX_RESPONSE_BYTES * 16)
    async with deliverer(db, WebhookTarget(url=receiver.url, secret=SECRET), concurrency=1) as d:
        assert (await d.run_once(now=T0))["delivered"] == 2
    # The rest of each answer was left unread, so its connection was dropped, not reused.
    assert len(set(receiver.client_ports)) == 2


async def test_a_non_2xx_answer_is_a_failed_attempt(db: StateDB, receiver: Receiver) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    receiver.statuses = [500, 302, 204]
    async with deliverer(db, WebhookTarget(url=receiver.url, secret=SECRET, timeout_s=5)) as d:
        assert (await d.run_once(now=T0))["failed"] == 1
        row = await one_row(db, task_id)
        assert row["last_error"] == "webhook: HTTP 500 Internal Server Error"
        assert (await d.run_once(now=T0 + 10))["failed"] == 1
        assert (await one_row(db, task_id))["last_error"] == "webhook: HTTP 302 Found"
        assert (await d.run_once(now=T0 + 30))["delivered"] == 1
    assert [m for m, *_ in receiver.requests] == ["POST", "POST", "POST"]  # no redirect followed
    assert [p for _, p, *_ in receiver.requests] == ["/hook"] * 3


async def test_a_webhook_that_does_not_answer_in_time_is_a_failed_attempt(
    db: StateDB, receiver: Receiver
) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    receiver.delay_s = 5.0
    hook = WebhookTarget(url=receiver.url, secret=SECRET, timeout_s=0.3)
    async with deliverer(db, hook) as d:
        assert (await d.run_once(now=T0))["failed"] == 1
    error = (await one_row(db, task_id))["last_error"]
    assert error.startswith("webhook: ") and "0.3s" in error


async def test_an_unreachable_webhook_is_a_failed_attempt(db: StateDB) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()
    hook = WebhookTarget(url=f"http://127.0.0.1:{port}/", secret=SECRET, timeout_s=2)
    async with deliverer(db, hook) as d:
        assert (await d.run_once(now=T0))["failed"] == 1
    error = (await one_row(db, task_id))["last_error"]
    assert error.startswith(f"webhook: cannot reach http://127.0.0.1:{port}: "), error


# -- a local command --------------------------------------------------------------------------

NOTIFY_SCRIPT = """
import os, sys
data = sys.stdin.buffer.read()
mode = sys.argv[2]
if mode == "fail":
    sys.stderr.write("boom")
    sys.exit(3)
if mode == "hang":
    import time
    time.sleep(60)
with open(sys.argv[1], "wb") as f:
    f.write(os.environ["TASKWARD_NOTIFICATION_ID"].encode() + b"\\n" + data)
"""


@pytest.fixture
def notify_script(tmp_path: Path) -> Path:
    script = tmp_path / "notify.py"
    script.write_text(NOTIFY_SCRIPT)
    return script


async def test_a_command_receives_the_envelope_on_stdin(
    db: StateDB, notify_script: Path, tmp_path: Path
) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    out = tmp_path / "got.json"
    cmd = CommandTarget(argv=(sys.executable, str(notify_script), str(out), "ok"))
    assert (await deliverer(db, cmd).run_once(now=T0))["delivered"] == 1
    row = await one_row(db, task_id)
    first, _, data = out.read_bytes().partition(b"\n")
    assert first.decode() == row["id"] and data == envelope(row)


async def test_a_failing_or_hanging_command_is_a_failed_attempt(
    db: StateDB, notify_script: Path, tmp_path: Path
) -> None:
    task_id = await terminal_task(db, "queued", "skipped")
    out = str(tmp_path / "unused")
    failing = CommandTarget(argv=(sys.executable, str(notify_script), out, "fail"))
    assert (await deliverer(db, failing).run_once(now=T0))["failed"] == 1
    assert (await one_row(db, task_id))["last_error"] == "command: exit code 3: boom"
    hanging = CommandTarget(argv=(sys.executable, str(notify_script), out, "hang"), timeout_s=0.5)
    assert (await deliverer(db, hanging).run_once(now=T0 + 10))["failed"] == 1
    assert (await one_row(db, task_id))["last_error"] == "command: no acknowledgement within 0.5s"
    missing = CommandTarget(argv=("/nonexistent/notify",))
    assert (await deliverer(db, missing).run_once(now=T0 + 30))["failed"] == 1
    assert "cannot start" in (await one_row(db, task_id))["last_error"]


# -- configuration and the worker runtime -----------------------------------------------------


def test_targets_come_from_the_environment() -> None:
    assert OutboxConfig.from_env({}).targets == ()
    config = OutboxConfig.from_env(
        {
            "TASKWARD_WEBHOOK_URL": "https://example.invalid/hook",
            "TASKWARD_WEBHOOK_SECRET": "hush-hush",
            "TASKWARD_WEBHOOK_TIMEOUT_S": "2.5",
            "TASKWARD_NOTIFY_COMMAND": '["/usr/local/bin/notify", "--quiet"]',
        }
    )
    hook, cmd = config.targets
    assert isinstance(hook, WebhookTarget) and hook.timeout_s == 2.5 and hook.name == "webhook"
    assert "hush-hush" not in repr(hook)  # the secret never reaches logs
    assert isinstance(cmd, CommandTarget) and cmd.argv == ("/usr/local/bin/notify", "--quiet")
    assert config.effective_lease_s == 2.5 + 30.0 + 30.0
    with pytest.raises(TaskValidationError, match="secret"):
        OutboxConfig.from_env({"TASKWARD_WEBHOOK_URL": "https://example.invalid/hook"})
    with pytest.raises(TaskValidationError, match="http"):
        OutboxConfig.from_env({"TASKWARD_WEBHOOK_URL": "ftp://x/", "TASKWARD_WEBHOOK_SECRET": "x"})
    with pytest.raises(TaskValidationError, match="TASKWARD_WEBHOOK_SECRET") as bad:
        OutboxConfig.from_env(
            {"TASKWARD_WEBHOOK_URL": "https://x/", "TASKWARD_WEBHOOK_SECRET": "whsec_%%hush%%"}
        )
    assert "hush" not in str(bad.value)
    with pytest.raises(TaskValidationError, match="TASKWARD_NOTIFY_COMMAND"):
        OutboxConfig.from_env({"TASKWARD_NOTIFY_COMMAND": "notify --quiet"})
    with pytest.raises(TaskValidationError, match="argv"):
        OutboxConfig.from_env({"TASKWARD_NOTIFY_COMMAND": "[]"})
    with pytest.raises(TaskValidationError, match="TIMEOUT"):
        OutboxConfig.from_env(
            {"TASKWARD_NOTIFY_COMMAND": '["x"]', "TASKWARD_NOTIFY_COMMAND_TIMEOUT_S": "0"}
        )
    with pytest.raises(TaskValidationError, match="lease_s"):
        OutboxConfig(targets=(Recorder(timeout_s=10),), lease_s=5)
    with pytest.raises(TaskValidationError, match="distinct"):
        OutboxConfig(targets=(Recorder(), Recorder()))


async def test_run_delivers_until_stopped_and_stop_is_safe_twice(db: StateDB) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "skipped")  # the store's clock: due now
    rec = Recorder()
    d = deliverer(db, rec, poll_interval_s=0.05)
    runner = asyncio.create_task(d.run())
    await asyncio.wait_for(d.recorded.wait(), 10)
    d.stop()
    d.stop()
    await asyncio.wait_for(runner, 10)
    assert (await one_row(db, task_id))["status"] == "delivered"
    with pytest.raises(RuntimeError, match="stopped"):
        await d.run()
    never_started = deliverer(db)
    never_started.stop()
    never_started.stop()


async def test_the_worker_runtime_runs_a_deliverer_unless_disabled(db: StateDB) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "skipped")
    rec = Recorder()
    config = WorkerConfig(outbox=OutboxConfig(targets=(rec,), poll_interval_s=0.05))
    runtime = WorkerRuntime(db, REGISTRY, config)
    assert runtime.outbox is not None and runtime.outbox.owner == config.worker_id
    serving = asyncio.create_task(runtime.run())
    await asyncio.wait_for(runtime.outbox.recorded.wait(), 10)
    runtime.request_stop()
    assert await asyncio.wait_for(serving, 10) == 0
    assert (await one_row(db, task_id))["status"] == "delivered"
    assert runtime.outbox._is_closed  # its HTTP client closed with the worker
    assert WorkerRuntime(db, REGISTRY, WorkerConfig(deliver_outbox=False)).outbox is None


# -- schema -----------------------------------------------------------------------------------


async def test_the_outbox_table_has_its_columns_indexes_and_checks(
    db: StateDB, db_url: str
) -> None:
    from tests.migrations.test_migrations import _columns, _indexes

    assert await _columns(db, db_url, "dispatch_outbox") == {
        "id",
        "kind",
        "dedup_key",
        "schedule_run_id",
        "transition_id",
        "body",
        "status",
        "attempts",
        "max_attempts",
        "next_attempt_at",
        "lease_owner",
        "lease_expires_at",
        "acked_targets",
        "last_error",
        "created_at",
        "updated_at",
        "delivered_at",
        "expires_at",
    }
    assert {
        "idx_dispatch_outbox_due",
        "idx_dispatch_outbox_lease",
        "idx_dispatch_outbox_finished",
    } <= await _indexes(db, db_url)
    await enqueue_notification(db, kind="c", dedup_key="chk", body={}, now=T0)
    bad = [
        "UPDATE dispatch_outbox SET status = 'sent'",
        "UPDATE dispatch_outbox SET status = 'delivering'",  # a lease is required
        "UPDATE dispatch_outbox SET status = 'delivered'",  # delivered_at is required
    ]
    for sql in bad:
        if db.dialect == "sqlite":
            with (
                sqlite3.connect(db_url[len("sqlite:///") :]) as conn,
                pytest.raises(sqlite3.IntegrityError),
            ):
                conn.execute(sql)
        else:
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
                with pytest.raises(psycopg.errors.CheckViolation):
                    await conn.execute(sql)


async def test_a_webhook_url_is_named_by_its_endpoint_alone_in_errors_and_logs(
    db: StateDB, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # The failure text is stored on the outbox row every reader sees, and httpx logs each
    # request's URL at INFO; a webhook URL often carries its secret in its path or userinfo.
    hook = WebhookTarget(url="http://user:pw@127.0.0.1:1/services/T0/s3cret-path", secret=SECRET)
    row = {"id": "n1", "kind": "k", "attempts": 1}
    with pytest.raises(DeliveryFailed) as failed:
        await hook.deliver(b"{}", row)
    assert str(failed.value).startswith("cannot reach http://127.0.0.1:1: ")
    assert "s3cret-path" not in str(failed.value) and "pw" not in str(failed.value)
    secret_url = receiver.url + "/s3cret-path?token=hush"
    caplog.set_level(logging.DEBUG)
    await WebhookTarget(url=secret_url, secret=SECRET).deliver(b"{}", row)
    task_id = await terminal_task(db, "queued", "skipped")
    async with deliverer(db, WebhookTarget(url=secret_url, secret=SECRET)) as d:
        assert (await d.run_once(now=T0))["delivered"] == 1
    assert (await one_row(db, task_id))["status"] == "delivered"
    logged = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert len(logged) == 2 and all(receiver.url.removesuffix("/hook") in m for m in logged)
    everything = " ".join(r.getMessage() for r in caplog.records)
    assert "s3cret-path" not in everything and "hush" not in everything
    assert SECRET not in everything
    assert not logging.getLogger("httpx").filters  # removed with the clients
