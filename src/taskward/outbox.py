"""The notification outbox (ADR-0072 D6, DESIGN.md R12): the deliverer, its targets (signed
webhooks, a local command), operator retry, purge and the read side.

Rows move ``pending -> delivering -> delivered | dead_letter | expired``; a failed attempt
returns to ``pending`` with a next-attempt time, an expired deliverer lease returns to
``pending``, and an operator retry returns ``dead_letter``/``expired`` to ``pending``. Every
statement here touches ``dispatch_outbox`` only: delivery state never changes a task (D6).
Terminal transitions enqueue their notification themselves (``transitions.apply_transition``).

Known limits: delivery is at least once — a receiver dedupes by the notification ``id`` (or
``dedup_key``), both inside the signed body. A webhook request runs in a worker thread
(urllib); when it outlives its timeout the deliverer counts a failed attempt and moves on, but
the thread may still finish sending it. With no target configured nothing is claimed: rows stay
``pending`` (and expire at ``expires_at``) until a target is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import hmac
import json
import logging
import os
import random
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from taskward.adapters.process import (
    ENV_CHILD_ENV_PASSTHROUGH,
    child_environment,
    parse_env_passthrough,
    validate_env_passthrough,
)
from taskward.canonical import canonical_json, dumps
from taskward.cursors import decode_cursor, encode_cursor
from taskward.errors import NotificationNotFound, NotificationNotRetryable, TaskValidationError
from taskward.ids import new_id
from taskward.loops import raise_if_cancelling
from taskward.store.port import Row, StateDB
from taskward.store.retry import Streak, loop_backoff

log = logging.getLogger("taskward.outbox")

# The row states of R12. Finished rows are the only ones purge deletes (R11).
OUTBOX_STATUSES: Final = ("pending", "delivering", "delivered", "dead_letter", "expired")
FINISHED_STATUSES: Final = frozenset({"delivered", "dead_letter", "expired"})
RETRYABLE_STATUSES: Final = frozenset({"dead_letter", "expired"})

# Defaults a producer gets when it passes none; outbox_enqueue repeats them in SQL (a test
# checks they agree), so a terminal transition needs no import from this module.
DEFAULT_MAX_ATTEMPTS: Final = 10
DEFAULT_TTL_S: Final = 7 * 24 * 3600.0

DEFAULT_WEBHOOK_TIMEOUT_S: Final = 10.0
DEFAULT_COMMAND_TIMEOUT_S: Final = 30.0
# A delivery lease covers every target's timeout plus this slack, so a live deliverer has given
# up on a row before any other deliverer may reclaim it.
LEASE_SLACK_S: Final = 30.0
MAX_LIST_LIMIT: Final = 500
_ERROR_LIMIT: Final = 2000
_STDERR_TAIL: Final = 500

SIGNATURE_HEADER: Final = "X-Taskward-Signature"
TIMESTAMP_HEADER: Final = "X-Taskward-Timestamp"
DELIVERY_HEADER: Final = "X-Taskward-Delivery"
EVENT_HEADER: Final = "X-Taskward-Event"
ATTEMPT_HEADER: Final = "X-Taskward-Attempt"

ENV_WEBHOOK_URL: Final = "TASKWARD_WEBHOOK_URL"
ENV_WEBHOOK_SECRET: Final = "TASKWARD_WEBHOOK_SECRET"
ENV_WEBHOOK_TIMEOUT: Final = "TASKWARD_WEBHOOK_TIMEOUT_S"
ENV_COMMAND: Final = "TASKWARD_NOTIFY_COMMAND"
ENV_COMMAND_TIMEOUT: Final = "TASKWARD_NOTIFY_COMMAND_TIMEOUT_S"


# -- payload and signature ------------------------------------------------------------------


def envelope(row: Mapping[str, Any]) -> bytes:
    """The bytes every target receives for ``row``: canonical JSON of the notification's
    identity and its stored body. Stable across attempts, so a signature is too."""
    return canonical_json(
        {
            "id": row["id"],
            "kind": row["kind"],
            "dedup_key": row["dedup_key"],
            "task_id": row["schedule_run_id"],
            "transition_id": row["transition_id"],
            "created_at": float(row["created_at"]),  # SQLite may hand back an int
            "body": row["body"],
        }
    ).encode("utf-8")


def sign_payload(secret: str, payload: bytes) -> str:
    """The ``X-Taskward-Signature`` value: ``sha256=<hex HMAC-SHA256 of the exact bytes>``."""
    digest = hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_signature(secret: str, payload: bytes, header: str | None) -> bool:
    """For receivers: whether ``header`` is the signature of ``payload`` (constant time)."""
    return header is not None and hmac.compare_digest(sign_payload(secret, payload), header)


# -- targets ----------------------------------------------------------------------------------


class DeliveryFailed(Exception):
    """Raised by a target when the receiver did not acknowledge; one failed attempt."""


class DeliveryTarget(Protocol):
    """Where notifications go. ``deliver`` returns only once the receiver acknowledged and
    raises (``DeliveryFailed`` or any error) otherwise; the deliverer bounds it by
    ``timeout_s``. ``name`` identifies the target in ``acked_targets`` (unique per deliverer)."""

    @property
    def name(self) -> str: ...

    @property
    def timeout_s(self) -> float: ...

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None: ...


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook answer of 3xx is a failed attempt: redirects would re-send signed bodies to
    an address the operator did not configure (and urllib turns a redirected POST into GET)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _post(url: str, payload: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
    request = urllib.request.Request(url, data=payload, headers=dict(headers), method="POST")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        exc.close()
        raise DeliveryFailed(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise DeliveryFailed(f"cannot reach {url}: {exc.reason}") from None


def _validate_timeout(field_name: str, value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = -1.0
    if not number > 0 or number == float("inf"):
        raise TaskValidationError(field_name, value, "a number of seconds > 0")
    return number


@dataclass(frozen=True)
class WebhookTarget:
    """HTTP POST of the envelope, signed with HMAC-SHA256 of the exact body bytes.

    Any 2xx acknowledges; any other status, a redirect, a refused connection or no answer
    within ``timeout_s`` is a failed attempt.
    """

    url: str
    secret: str = field(repr=False)
    timeout_s: float = DEFAULT_WEBHOOK_TIMEOUT_S
    name: str = "webhook"

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise TaskValidationError("webhook url", self.url, "an http:// or https:// URL")
        if not self.secret:
            raise TaskValidationError(
                "webhook secret",
                "",
                "a non-empty secret",
                message=f"a webhook needs a signing secret ({ENV_WEBHOOK_SECRET}); "
                "receivers verify X-Taskward-Signature with it",
            )
        object.__setattr__(
            self, "timeout_s", _validate_timeout("webhook timeout_s", self.timeout_s)
        )

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "taskward-outbox",
            SIGNATURE_HEADER: sign_payload(self.secret, payload),
            TIMESTAMP_HEADER: str(int(time.time())),
            DELIVERY_HEADER: str(row["id"]),
            EVENT_HEADER: str(row["kind"]),
            ATTEMPT_HEADER: str(row["attempts"]),
        }
        await asyncio.to_thread(_post, self.url, payload, headers, self.timeout_s)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass(frozen=True)
class CommandTarget:
    """A local program: ``argv`` run directly (never through a shell) in its own process
    group, the envelope on stdin. Exit code 0 acknowledges; anything else, a program that
    cannot start or one still running at ``timeout_s`` (its group is killed) is a failed
    attempt. Its environment is the minimal one of ``process.child_environment`` (plus
    ``env_passthrough``), never the worker's, with ``TASKWARD_NOTIFICATION_ID``, ``_KIND``,
    ``_DEDUP_KEY`` and ``_ATTEMPT`` added."""

    argv: tuple[str, ...]
    timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    name: str = "command"
    env_passthrough: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        argv = self.argv
        if (
            isinstance(argv, str)
            or not argv
            or not all(isinstance(a, str) for a in argv)
            or not argv[0]
        ):
            raise TaskValidationError(
                "notify command", argv, "a non-empty list of strings (an argv, no shell)"
            )
        object.__setattr__(self, "argv", tuple(argv))
        object.__setattr__(
            self, "timeout_s", _validate_timeout("command timeout_s", self.timeout_s)
        )
        object.__setattr__(self, "env_passthrough", validate_env_passthrough(self.env_passthrough))

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
        # Not the worker's environment: its tokens and secrets stay out of a local program.
        notification = {
            "TASKWARD_NOTIFICATION_ID": str(row["id"]),
            "TASKWARD_NOTIFICATION_KIND": str(row["kind"]),
            "TASKWARD_NOTIFICATION_DEDUP_KEY": str(row["dedup_key"]),
            "TASKWARD_NOTIFICATION_ATTEMPT": str(row["attempts"]),
        }
        env = child_environment(notification, self.env_passthrough)
        # stderr goes to a file, not a pipe: a straggler holding a pipe open must not keep
        # Process.wait() from returning.
        with tempfile.TemporaryFile() as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise DeliveryFailed(f"cannot start {self.argv[0]!r}: {exc}") from None
            try:
                assert proc.stdin is not None
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(payload)
                    await proc.stdin.drain()
                proc.stdin.close()
                code = await proc.wait()
            except BaseException:  # timed out or cancelled: the group must not outlive us
                _kill_group(proc.pid)
                await proc.wait()
                raise
            if code != 0:
                err.seek(0)
                tail = err.read()[-_STDERR_TAIL:].decode("utf-8", "replace").strip()
                raise DeliveryFailed(f"exit code {code}" + (f": {tail}" if tail else ""))


# -- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Delay before attempt ``n + 1`` after failed attempt ``n``: ``base * factor^(n-1)``,
    capped, then ±``jitter`` (a fraction) so deliverers do not retry in lockstep."""

    base_s: float = 10.0
    factor: float = 2.0
    cap_s: float = 3600.0
    jitter: float = 0.2

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        try:
            raw = min(self.cap_s, self.base_s * self.factor ** max(attempt - 1, 0))
        except OverflowError:
            raw = self.cap_s
        if self.jitter:
            raw *= 1 + self.jitter * (2 * rng.random() - 1)
        return max(0.0, raw)


@dataclass(frozen=True)
class OutboxConfig:
    """What a deliverer sends where, and how often it looks. ``from_env`` reads the targets."""

    targets: tuple[DeliveryTarget, ...] = ()
    poll_interval_s: float = 1.0
    batch_size: int = 20
    concurrency: int = 4
    backoff: Backoff = field(default_factory=Backoff)
    lease_s: float | None = None  # None: the targets' timeouts plus LEASE_SLACK_S

    def __post_init__(self) -> None:
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise TaskValidationError("targets", names, "targets with distinct names")
        if self.batch_size < 1:
            raise TaskValidationError("batch_size", self.batch_size, "an integer >= 1")
        if self.concurrency < 1:
            raise TaskValidationError("concurrency", self.concurrency, "an integer >= 1")
        budget = sum(t.timeout_s for t in self.targets)
        if self.lease_s is not None and self.lease_s <= budget:
            raise TaskValidationError(
                "lease_s", self.lease_s, f"more than the targets' timeouts together ({budget:g}s)"
            )

    @property
    def effective_lease_s(self) -> float:
        if self.lease_s is not None:
            return self.lease_s
        return sum(t.timeout_s for t in self.targets) + LEASE_SLACK_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OutboxConfig:
        """Targets from ``TASKWARD_WEBHOOK_URL`` (+ ``_SECRET``, required, and ``_TIMEOUT_S``)
        and ``TASKWARD_NOTIFY_COMMAND`` (a JSON argv list, + ``_TIMEOUT_S``; its environment
        passes ``TASKWARD_CHILD_ENV_PASSTHROUGH`` through, as a task's does)."""
        env = os.environ if environ is None else environ
        targets: list[DeliveryTarget] = []
        url = env.get(ENV_WEBHOOK_URL, "").strip()
        if url:
            targets.append(
                WebhookTarget(
                    url=url,
                    secret=env.get(ENV_WEBHOOK_SECRET, ""),
                    timeout_s=_validate_timeout(
                        ENV_WEBHOOK_TIMEOUT,
                        env.get(ENV_WEBHOOK_TIMEOUT, DEFAULT_WEBHOOK_TIMEOUT_S),
                    ),
                )
            )
        command = env.get(ENV_COMMAND, "").strip()
        if command:
            try:
                argv = json.loads(command)
            except json.JSONDecodeError:
                argv = None
            if not isinstance(argv, list):
                raise TaskValidationError(
                    ENV_COMMAND, command, 'a JSON argv list such as ["/usr/local/bin/notify"]'
                )
            targets.append(
                CommandTarget(
                    argv=tuple(argv),
                    timeout_s=_validate_timeout(
                        ENV_COMMAND_TIMEOUT,
                        env.get(ENV_COMMAND_TIMEOUT, DEFAULT_COMMAND_TIMEOUT_S),
                    ),
                    env_passthrough=parse_env_passthrough(env.get(ENV_CHILD_ENV_PASSTHROUGH)),
                )
            )
        return cls(targets=tuple(targets))


# -- producers and operators ------------------------------------------------------------------


async def enqueue_notification(
    db: StateDB,
    *,
    kind: str,
    dedup_key: str,
    body: Mapping[str, Any],
    schedule_run_id: str | None = None,
    transition_id: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ttl_s: float = DEFAULT_TTL_S,
    now: float | None = None,
) -> bool:
    """Enqueue one notification unless ``dedup_key`` exists (D6 ``enqueue_dispatch``); returns
    whether a row was inserted. Terminal transitions enqueue in their own transaction instead."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise TaskValidationError("max_attempts", max_attempts, "an integer >= 1")
    ttl_s = _validate_timeout("ttl_s", ttl_s)
    async with db.transaction(now=now) as tx:
        inserted = await tx.execute(
            "outbox_enqueue",
            {
                "id": new_id(),
                "kind": kind,
                "dedup_key": dedup_key,
                "schedule_run_id": schedule_run_id,
                "transition_id": transition_id,
                "body": dumps(dict(body)),
                "max_attempts": max_attempts,
                "ttl_s": ttl_s,
            },
        )
    return inserted == 1


async def get_notification(db: StateDB, notification_id: str) -> Row:
    """One dispatch_outbox row; raises NotificationNotFound."""
    row = await db.fetchone("outbox_get", {"id": notification_id})
    if row is None:
        raise NotificationNotFound(notification_id)
    return row


async def list_notifications(
    db: StateDB,
    *,
    status: str | None = None,
    task_id: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Row], str | None]:
    """Notifications newest first; returns ``(rows, next_cursor)`` (None on the last page)."""
    if status is not None and status not in OUTBOX_STATUSES:
        raise TaskValidationError("status", status, OUTBOX_STATUSES)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise TaskValidationError("limit", limit, f"1..{MAX_LIST_LIMIT}")
    cursor_at, cursor_id = decode_cursor(cursor) if cursor else (None, None)
    rows = await db.fetchall(
        "outbox_list",
        {
            "status": status,
            "schedule_run_id": task_id,
            "cursor_created_at": cursor_at,
            "cursor_id": cursor_id,
            "limit": limit + 1,
        },
    )
    next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return rows[:limit], next_cursor


async def count_notifications(db: StateDB) -> dict[str, int]:
    """Rows per outbox status (every status present, zero when none)."""
    counts = dict.fromkeys(OUTBOX_STATUSES, 0)
    for row in await db.fetchall("outbox_count_by_status"):
        counts[row["status"]] = int(row["n"])
    return counts


async def retry_notification(
    db: StateDB, notification_id: str, *, ttl_s: float = DEFAULT_TTL_S, now: float | None = None
) -> Row:
    """Operator retry (R12): ``dead_letter``/``expired`` -> ``pending``, attempts reset, due
    now, expiring ``ttl_s`` from now. Targets that acknowledged it before are not sent it again.

    Raises:
        NotificationNotFound: no row has this id.
        NotificationNotRetryable: the row is pending, delivering or delivered (nothing written).
    """
    ttl_s = _validate_timeout("ttl_s", ttl_s)
    async with db.transaction(now=now) as tx:
        row = await tx.fetchone("outbox_retry", {"id": notification_id, "ttl_s": ttl_s})
        current = (
            None if row is not None else await tx.fetchone("outbox_get", {"id": notification_id})
        )
    if row is not None:
        return row
    if current is None:
        raise NotificationNotFound(notification_id)
    raise NotificationNotRetryable(notification_id, current["status"])


async def purge_notifications(db: StateDB, *, older_than_s: float, now: float | None = None) -> int:
    """Delete finished rows (delivered, dead_letter, expired) whose last change is more than
    ``older_than_s`` before now; pending and delivering rows are never touched (R11). Returns
    the number deleted."""
    if (
        isinstance(older_than_s, bool)
        or not isinstance(older_than_s, int | float)
        or not (0 <= older_than_s < float("inf"))
    ):
        raise TaskValidationError("older_than_s", older_than_s, "a number of seconds >= 0")
    async with db.transaction(now=now) as tx:
        return await tx.execute("outbox_purge_finished", {"older_than_s": float(older_than_s)})


# -- the deliverer ----------------------------------------------------------------------------


class DelivererState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


def new_deliverer_id() -> str:
    return f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"


class OutboxDeliverer:
    """Claims due rows under a lease of its own, sends each to every target, and records the
    outcome. Several deliverers (threads, processes, machines) may run at once: the claim is a
    compare-and-swap, and every later write is guarded by the lease (owner and attempt), so a
    row is never delivered by two of them at the same time.

    ``run_once(now=)`` is one pass (tests call it); ``run()`` loops until ``stop()``.
    """

    def __init__(
        self,
        db: StateDB,
        config: OutboxConfig | None = None,
        *,
        owner: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.db = db
        self.config = config or OutboxConfig()
        self.owner = owner or new_deliverer_id()
        self.state = DelivererState.NEW
        self._rng = rng or random.Random()
        self._stopping = asyncio.Event()
        # Set whenever an attempt's outcome has been written (a hook for tests: no sleeps).
        self.recorded = asyncio.Event()

    @property
    def targets(self) -> Sequence[DeliveryTarget]:
        return self.config.targets

    async def run_once(self, *, now: float | None = None) -> dict[str, int]:
        """One pass: release expired leases, expire rows past ``expires_at``, then claim up to
        ``batch_size`` due rows and deliver them. Returns counts per outcome."""
        counts = dict.fromkeys(
            ("released", "expired", "claimed", "delivered", "failed", "dead_letter", "lost"), 0
        )
        # A read first: an idle pass takes no write lock (SQLite has one per file).
        work = await self.db.fetchone("outbox_pending_work", {"now": now})
        if work is None:
            return counts
        if work["has_stale_leases"] or work["has_expired"]:
            async with self.db.transaction(now=now) as tx:
                for row in await tx.fetchall("outbox_release_expired_leases"):
                    counts["released"] += 1
                    if row["status"] in ("dead_letter", "expired"):
                        counts[row["status"]] += 1
                counts["expired"] += len(await tx.fetchall("outbox_expire_due"))
        if not self.targets or not (work["has_due"] or counts["released"]):
            return counts
        async with self.db.transaction(now=now) as tx:
            rows = await tx.fetchall(
                "outbox_claim_due",
                {
                    "owner": self.owner,
                    "lease_s": self.config.effective_lease_s,
                    "limit": self.config.batch_size,
                },
            )
        counts["claimed"] = len(rows)
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(row: Row) -> str:
            async with gate:
                return await self._deliver(row, now)

        for outcome in await asyncio.gather(*(one(row) for row in rows)):
            counts[outcome] += 1
        return counts

    async def _deliver(self, row: Row, now: float | None) -> str:
        payload = envelope(row)
        acked = [str(name) for name in row["acked_targets"] or []]
        errors: list[str] = []
        for target in self.targets:
            if target.name in acked:
                continue  # acknowledged on an earlier attempt: not sent again
            try:
                async with asyncio.timeout(target.timeout_s):
                    await target.deliver(payload, row)
            except TimeoutError:
                errors.append(f"{target.name}: no acknowledgement within {target.timeout_s:g}s")
            except DeliveryFailed as exc:
                errors.append(f"{target.name}: {exc}")
            except Exception as exc:  # a target's bug is one failed attempt, not a dead pass
                errors.append(f"{target.name}: {type(exc).__name__}: {exc}")
            else:
                acked.append(target.name)
        lease = {
            "id": row["id"],
            "owner": self.owner,
            "attempts": row["attempts"],
            "acked_targets": dumps(acked),
        }
        async with self.db.transaction(now=now) as tx:
            if not errors:
                done = await tx.fetchone("outbox_ack", lease)
                outcome = "delivered" if done else "lost"
            else:
                failed = await tx.fetchone(
                    "outbox_fail",
                    {
                        **lease,
                        "error": "; ".join(errors)[:_ERROR_LIMIT],
                        "delay_s": self.config.backoff.delay_s(int(row["attempts"]), self._rng),
                    },
                )
                outcome = "lost" if failed is None else _FAIL_OUTCOME[failed["status"]]
        self.recorded.set()
        if outcome == "lost":
            # Our lease was released and the row reclaimed (we stalled past lease_s): the
            # other deliverer's record stands.
            log.warning("outbox row %s: lease lost before recording the outcome", row["id"])
        elif errors:
            log.info("outbox row %s attempt %s failed: %s", row["id"], row["attempts"], errors)
        return outcome

    async def run(self) -> None:
        """Deliver until ``stop()``: a pass, then a wait of ``poll_interval_s`` (none after a
        full batch). A failing pass (the store may be away) is logged and retried after a
        backoff that grows with each consecutive failure."""
        if self.state is not DelivererState.NEW:
            raise RuntimeError(f"this deliverer is {self.state.value}; create a new one")
        self.state = DelivererState.RUNNING
        streak = Streak(loop_backoff(self.config.poll_interval_s), what="outbox pass", logger=log)
        try:
            while not self._stopping.is_set():
                raise_if_cancelling()
                wait_s = self.config.poll_interval_s
                try:
                    counts = await self.run_once()
                except Exception as exc:
                    counts = {}
                    wait_s = streak.failed(exc)
                else:
                    streak.succeeded()
                if counts.get("claimed", 0) >= self.config.batch_size:
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._stopping.wait()
        finally:
            self.state = DelivererState.STOPPED

    def stop(self) -> None:
        """Ask ``run()`` to return after the current pass; safe twice or before ``run()``."""
        if self.state is DelivererState.NEW:
            self.state = DelivererState.STOPPED
        self._stopping.set()


_FAIL_OUTCOME: Final = {"pending": "failed", "dead_letter": "dead_letter", "expired": "expired"}
