"""The deliverer: claims due rows under a lease of its own, sends each to every target and
records the outcome, guarded by the lease (R12).

It owns one ``httpx.AsyncClient`` for its webhook targets (opened at the first webhook
delivery, so connections are reused across deliveries; closed by ``aclose()``, which ``run()``
calls when it returns); a closed deliverer refuses to deliver again."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import socket
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from taskward.canonical import dumps
from taskward.loops import raise_if_cancelling
from taskward.outbox.config import OutboxConfig
from taskward.outbox.signing import envelope
from taskward.outbox.targets import (
    DeliveryFailed,
    DeliveryTarget,
    HideWebhookUrls,
    WebhookTarget,
    httpx_log,
    new_http_client,
)
from taskward.store.port import Row, StateDB
from taskward.store.retry import Streak, loop_backoff

if TYPE_CHECKING:
    import httpx  # imported when the first webhook needs a client (targets.new_http_client)

log = logging.getLogger("taskward.outbox")

_ERROR_LIMIT: Final = 2000


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
    ``aclose()`` (or ``async with``) closes its HTTP client when passes are driven from outside.
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
        self._http: httpx.AsyncClient | None = None
        self._hide_urls: HideWebhookUrls | None = None
        self._is_closed = False

    async def __aenter__(self) -> OutboxDeliverer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _http_client(self) -> httpx.AsyncClient:
        """The one client of this deliverer's webhooks, opened on first use."""
        if self._is_closed:
            raise RuntimeError("this deliverer is closed; create a new one")
        if self._http is None:
            urls = [t.url for t in self.targets if isinstance(t, WebhookTarget)]
            self._hide_urls = HideWebhookUrls(urls)
            httpx_log.addFilter(self._hide_urls)
            self._http = new_http_client(max_connections=self.config.concurrency)
        return self._http

    async def aclose(self) -> None:
        """Close the HTTP client; safe twice. The deliverer delivers no more."""
        self._is_closed = True
        if self.state is DelivererState.NEW:
            self.state = DelivererState.STOPPED
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()
        if self._hide_urls is not None:
            httpx_log.removeFilter(self._hide_urls)
            self._hide_urls = None

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
            self._count(counts)
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
        self._count(counts)
        return counts

    def _count(self, counts: dict[str, int]) -> None:
        """The pass's outcomes into this process's metrics: the one place they are counted."""
        if self.db.metrics is not None:
            self.db.metrics.outbox_outcomes(counts)

    async def _deliver(self, row: Row, now: float | None) -> str:
        payload = envelope(row)
        acked = [str(name) for name in row["acked_targets"] or []]
        errors: list[str] = []
        for target in self.targets:
            if target.name in acked:
                continue  # acknowledged on an earlier attempt: not sent again
            try:
                async with asyncio.timeout(target.timeout_s):
                    if isinstance(target, WebhookTarget):
                        await target.deliver(payload, row, client=self._http_client())
                    else:
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
                        "delay_s": self.config.backoff.delay(
                            int(row["attempts"]), self._rng.random
                        ),
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
            await self.aclose()

    def stop(self) -> None:
        """Ask ``run()`` to return after the current pass; safe twice or before ``run()``."""
        if self.state is DelivererState.NEW:
            self.state = DelivererState.STOPPED
        self._stopping.set()


_FAIL_OUTCOME: Final = {"pending": "failed", "dead_letter": "dead_letter", "expired": "expired"}
