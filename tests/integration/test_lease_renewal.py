"""Lease renewal (DESIGN.md R25, ADR-0037 protocol version two), on both backends: a renewing
worker's claim grants ``lease_ttl`` alone, a renewal moves the expiry by compare-and-swap on the
lease id and never past the deadline + slack, the owner's completion after renewals applies, and
a run whose renewal lost is cancelled and its result kept only as a ``stale_result`` event.

Time is injected (``now=``) wherever a lease must lapse or a renewal must land at a given time;
waits poll a condition, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import (
    MIN_RENEWABLE_LEASE_TTL_SECONDS,
    Claimed,
    WorkerSpec,
    claim_rows,
    lease_expiry,
)
from taskward.claims.renewal import renew_lease
from taskward.execution import RetryPolicy, settle_lease
from taskward.host import (
    AdapterRunner,
    LocalSummaryStore,
    LocalTaskSource,
    RenewsLeases,
    ResidentEngineHost,
    Task,
    TaskAck,
    TaskFailure,
    TaskSession,
)
from taskward.maintenance.reaper import promote_due_retries, reap_expired_leases
from taskward.maintenance.service import write_edge
from taskward.models import Actor
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import StateDB
from taskward.testing import wait_until
from taskward.transitions import recovery

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))
MODULE = "tests.integration.worker_tasks"
PY_REGISTRY = build_registry(
    AdapterConfig(imports=(MODULE,), command_allowlist=frozenset({"true"}))
)
TTL_S = 6.0
SLACK_S = 30.0
TIMEOUT_S = 600.0
T0 = 1_000_000.0
IMMEDIATE = RetryPolicy(base_s=0.0, jitter=0.0)
ACCEPTED = TaskAck(applied=True)
STALE = TaskAck(applied=False, rejection="stale_lease")
MISSING = TaskAck(applied=False, rejection="missing_holder")


async def submit(
    db: StateDB,
    args: dict[str, Any] | None = None,
    *,
    now: float = T0,  # queued long before any injected claim time: due for every claim (R16)
    kind: str = "command",
    registry: TaskAdapterRegistry = REGISTRY,
) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args if args is not None else {"argv": ["true"], "timeout_s": TIMEOUT_S},
        execution_target="host",
        idempotency_key=f"renew-{uuid.uuid4()}",
    )
    return await taskward.submit_task(db, app, registry=registry, now=now)


def spec(
    worker_id: str = "host:aaaaaaaa",
    *,
    renews: bool = True,
    lease_ttl: float = TTL_S,
    capabilities: tuple[str, ...] = (),
) -> WorkerSpec:
    return WorkerSpec(
        worker_id=worker_id,
        kinds=PY_REGISTRY.kinds(),
        capabilities=capabilities,
        lease_ttl=lease_ttl,
        lease_slack_s=SLACK_S,
        renews=renews,
    )


# -- the claim (R5, R25) ------------------------------------------------------------------------


def test_a_renewing_worker_refuses_a_lease_too_short_to_renew() -> None:
    with pytest.raises(ValueError, match="too short to renew"):
        spec(lease_ttl=MIN_RENEWABLE_LEASE_TTL_SECONDS - 0.5)
    assert spec(lease_ttl=MIN_RENEWABLE_LEASE_TTL_SECONDS).renews
    assert not spec(renews=False, lease_ttl=0.5).renews  # version one's rule: any ttl


def test_lease_expiry_covers_the_deadline_unless_the_worker_renews() -> None:
    deadline = T0 + TIMEOUT_S
    assert lease_expiry(spec(renews=False), deadline, now=T0) == deadline + SLACK_S
    assert lease_expiry(spec(), deadline, now=T0) == T0 + TTL_S
    # a renewing lease never reaches past the deadline + slack, not even at its claim
    assert lease_expiry(spec(lease_ttl=3600.0), deadline, now=T0) == deadline + SLACK_S


# Paged: a worker with an affinity token always pages (claims.passes.pass_call), so both the
# one-statement claim (PostgreSQL's run_claim_batch) and the paged pass are exercised.
@pytest.mark.parametrize("capabilities", [(), ("warmed-cache",)], ids=["first_page", "paged"])
async def test_a_renewing_workers_claim_grants_the_ttl_and_not_the_deadline(
    db: StateDB, capabilities: tuple[str, ...]
) -> None:
    for _ in range(3):
        await submit(db)
    now = T0 + 10
    workers = {
        "renewing": spec(capabilities=capabilities),
        "covering": spec("host:bbbbbbbb", renews=False, capabilities=capabilities),
        "long_ttl": spec("host:cccccccc", lease_ttl=3600.0, capabilities=capabilities),
    }
    expected = {
        "renewing": now + TTL_S,  # R25: the ttl alone
        "covering": now + TIMEOUT_S + SLACK_S,  # R5: the lease covers the deadline
        "long_ttl": now + TIMEOUT_S + SLACK_S,  # R25: never past the deadline + slack
    }
    for name, worker in workers.items():
        [claimed] = await claim_rows(db, worker, limit=1, now=now)
        row = await taskward.get_task(db, claimed.lease.task_id)
        assert row["leased_by"] == worker.worker_id
        assert row["deadline_at"] == pytest.approx(now + TIMEOUT_S)
        assert row["lease_expires_at"] == pytest.approx(expected[name]), name
        assert claimed.lease.lease_expires_at == pytest.approx(row["lease_expires_at"])


async def test_a_renewing_claim_keeps_a_short_lease_at_the_stores_own_time(db: StateDB) -> None:
    """No ``now`` injected: the claim's time is the store's (R9), the lease ``lease_ttl``."""
    task_id = await submit(db, now=time.time())
    before = time.time()
    [claimed] = await claim_rows(db, spec(), limit=1)
    row = await taskward.get_task(db, task_id)
    assert row["lease_expires_at"] - row["deadline_at"] == pytest.approx(TTL_S - TIMEOUT_S)
    assert before - 5 < row["lease_expires_at"] - TTL_S < time.time() + 5
    assert claimed.lease.lease_expires_at == pytest.approx(row["lease_expires_at"])


# -- the renewal's write (run_renew_lease) -------------------------------------------------------


async def claim_one(db: StateDB, worker: WorkerSpec, *, now: float) -> Claimed:
    [claimed] = await claim_rows(db, worker, limit=1, now=now)
    return claimed


async def renew(
    db: StateDB, claimed: Claimed, *, now: float, worker: WorkerSpec | None = None
) -> float | None:
    worker = worker or spec()
    lease = claimed.lease
    return await renew_lease(
        db,
        lease.task_id,
        lease.leased_by,
        lease.attempt,
        lease_ttl=worker.lease_ttl,
        lease_slack_s=worker.lease_slack_s,
        now=now,
    )


async def audit(db: StateDB, task_id: str) -> tuple[int, int]:
    """How many facts and events the task has."""
    facts = await taskward.list_transitions(db, task_id)
    events = await db.fetchall("event_list", {"task_id": task_id})
    return len(facts), len(events)


async def test_a_renewal_extends_the_expiry_by_compare_and_swap_and_changes_no_status(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    claimed = await claim_one(db, spec(), now=T0)
    before = await taskward.get_task(db, task_id)
    audited = await audit(db, task_id)
    assert await renew(db, claimed, now=T0 + 2) == pytest.approx(T0 + 2 + TTL_S)
    assert await renew(db, claimed, now=T0 + 4) == pytest.approx(T0 + 4 + TTL_S)
    after = await taskward.get_task(db, task_id)
    assert after["lease_expires_at"] == pytest.approx(T0 + 4 + TTL_S)
    # nothing else moved: not a transition (no fact, no event), the same owner and attempt
    assert {k: v for k, v in after.items() if k != "lease_expires_at"} == {
        k: v for k, v in before.items() if k != "lease_expires_at"
    }
    assert await audit(db, task_id) == audited


async def test_a_renewal_after_nominal_expiry_applies_until_the_row_changes(db: StateDB) -> None:
    """R4: ownership is the row's, not the clock's; and a reaper that saw the old expiry loses
    to the renewal that landed first (it guards the expiry it saw)."""
    task_id = await submit(db)
    claimed = await claim_one(db, spec(), now=T0)
    late = T0 + TTL_S + 5
    [seen] = await db.fetchall("run_expired_leases", {"now": late, "limit": 10})
    assert seen["id"] == task_id
    assert await renew(db, claimed, now=late) == pytest.approx(late + TTL_S)
    edge = recovery.lease_expired(seen, retry_at=late)
    assert not await write_edge(db, edge, now=late)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["leased_by"]) == ("running", claimed.lease.leased_by)


async def test_a_renewal_under_a_reaped_and_reclaimed_lease_is_refused_and_changes_nothing(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    old = await claim_one(db, spec("host:aaaaaaaa"), now=T0)
    lapsed = T0 + TTL_S + 1
    await reap_expired_leases(db, now=lapsed, retry_policy=IMMEDIATE)
    assert await renew(db, old, now=lapsed) is None  # reaped: retry_wait, no owner
    await promote_due_retries(db, now=lapsed)
    new = await claim_one(db, spec("host:bbbbbbbb"), now=lapsed + 1)
    assert (new.lease.task_id, new.lease.attempt) == (task_id, old.lease.attempt + 1)
    before = await taskward.get_task(db, task_id)
    audited = await audit(db, task_id)
    assert await renew(db, old, now=lapsed + 2) is None
    assert await taskward.get_task(db, task_id) == before
    assert await audit(db, task_id) == audited
    # the current holder's renewal applies
    assert await renew(db, new, now=lapsed + 2) == pytest.approx(lapsed + 2 + TTL_S)


async def test_a_renewal_never_reaches_past_the_deadline_plus_slack(db: StateDB) -> None:
    task_id = await submit(db, {"argv": ["true"], "timeout_s": 10.0})
    claimed = await claim_one(db, spec(), now=T0)
    horizon = T0 + 10.0 + SLACK_S
    assert claimed.lease.lease_expires_at == pytest.approx(T0 + TTL_S)
    assert await renew(db, claimed, now=horizon - 2) == pytest.approx(horizon)
    # past the horizon the lease stays where it is: never moved beyond it, never shortened
    assert await renew(db, claimed, now=horizon + 5) == pytest.approx(horizon)
    row = await taskward.get_task(db, task_id)
    assert row["lease_expires_at"] == pytest.approx(horizon)


async def test_a_renewal_never_shortens_a_lease_that_covers_its_deadline(db: StateDB) -> None:
    """A version-one lease (it covers the deadline) renewed with a short ttl keeps its expiry."""
    await submit(db)
    claimed = await claim_one(db, spec(renews=False), now=T0)
    covering = T0 + TIMEOUT_S + SLACK_S
    assert claimed.lease.lease_expires_at == pytest.approx(covering)
    assert await renew(db, claimed, now=T0 + 1) == pytest.approx(covering)


async def test_a_renewal_of_an_unknown_or_finished_task_is_refused(db: StateDB) -> None:
    task_id = await submit(db)
    claimed = await claim_one(db, spec(), now=T0)
    assert (
        await renew_lease(
            db, f"no-such-{uuid.uuid4()}", "host:aaaaaaaa", 1, lease_ttl=TTL_S, lease_slack_s=0.0
        )
        is None
    )
    outcome = taskward.TaskExecutionResult(status="completed", exit_code=0)
    done = await settle_lease(
        db,
        claimed.lease,
        outcome,
        actor=Actor(type="system", id=claimed.lease.leased_by),
        max_attempts=3,
        policy=IMMEDIATE,
        now=T0 + 1,
    )
    assert done.applied
    assert await renew(db, claimed, now=T0 + 2) is None
    assert (await taskward.get_task(db, task_id))["status"] == "completed"


# -- LocalTaskSource.renew (host.ports.RenewsLeases) ----------------------------------------------


def source(
    db: StateDB,
    worker_id: str = "host:aaaaaaaa",
    *,
    renews: bool = True,
    one_step: bool = False,
    registry: TaskAdapterRegistry = REGISTRY,
) -> LocalTaskSource:
    worker = WorkerSpec(
        worker_id=worker_id,
        kinds=registry.kinds(),
        lease_ttl=TTL_S,
        lease_slack_s=SLACK_S,
        renews=renews,
    )
    summaries = LocalSummaryStore(db) if one_step else None
    return LocalTaskSource(db, worker, retry_policy=IMMEDIATE, summaries=summaries)


async def claim(src: LocalTaskSource) -> Task:
    task = await src.claim()
    assert task is not None
    return task


async def reclaim_elsewhere(db: StateDB, task_id: str, worker_id: str = "host:bbbbbbbb") -> Task:
    """The holder looks dead: its lease lapses (time injected), the reaper requeues the task and
    another worker claims it."""
    lapsed = (await taskward.get_task(db, task_id))["lease_expires_at"] + 0.001
    await reap_expired_leases(db, now=lapsed, retry_policy=IMMEDIATE)
    await promote_due_retries(db, now=lapsed)
    [claimed] = await claim_rows(db, spec(worker_id), limit=1, now=lapsed + 1)
    assert claimed.lease.task_id == task_id
    return Task(
        id=task_id,
        objective="reclaimed",
        cwd=Path.cwd(),
        lease_id=claimed.lease.lease_id,
        lease_expires_at=datetime.fromtimestamp(claimed.lease.deadline_at + SLACK_S, UTC),
        attempt=claimed.lease.attempt,
        deadline=datetime.fromtimestamp(claimed.lease.deadline_at, UTC),
    )


async def test_a_renewing_source_hands_out_a_task_whose_lease_renewal_covers_the_deadline(
    db: StateDB,
) -> None:
    """D1 holds for the Task (kept as recorded, R10): its lease covers the deadline, by renewal
    up to the deadline + slack; the row's own expiry is ``lease_ttl`` ahead."""
    task_id = await submit(db)
    src = source(db)
    assert src.renew_every_s == pytest.approx(TTL_S / 3)
    assert source(db, renews=False).renew_every_s is None
    task = await claim(src)
    row = await taskward.get_task(db, task_id)
    assert row["lease_expires_at"] == pytest.approx(row["deadline_at"] - TIMEOUT_S + TTL_S)
    assert task.deadline == datetime.fromtimestamp(row["deadline_at"], UTC)
    assert task.lease_expires_at == datetime.fromtimestamp(row["deadline_at"] + SLACK_S, UTC)
    assert isinstance(src, RenewsLeases)


async def test_local_source_renew_extends_its_lease_and_refuses_any_other(db: StateDB) -> None:
    first, second = await submit(db), await submit(db)
    src = source(db)
    task = await claim(src)
    # Admitted at the same clock reading, either may come first in claim order (its id's
    # random tail decides): the one claimed is renewed, the other never was leased.
    task_id = task.id
    never = second if task_id == first else first
    claimed_expiry = src.claimed(task_id).lease.lease_expires_at
    assert await src.renew(task_id, task.lease_id) == ACCEPTED
    row = await taskward.get_task(db, task_id)
    assert row["lease_expires_at"] >= claimed_expiry
    # the side channel knows the renewed expiry, as the row says
    assert src.claimed(task_id).lease.lease_expires_at == row["lease_expires_at"]
    for forged in ("host:bbbbbbbb/1", "host:aaaaaaaa/2", "nonsense"):
        assert await src.renew(task_id, forged) == STALE
    assert not src.tokens[task_id].is_cancelled  # a forged id stops nothing
    assert await src.renew(f"no-such-{uuid.uuid4()}", task.lease_id) == MISSING
    assert await src.renew(never, "host:aaaaaaaa/1") == MISSING
    assert (await taskward.get_task(db, task_id))["lease_expires_at"] == row["lease_expires_at"]


async def test_a_renewal_that_loses_cancels_the_runs_token(db: StateDB) -> None:
    task_id = await submit(db)
    src = source(db)
    task = await claim(src)
    token = src.tokens[task_id]
    new = await reclaim_elsewhere(db, task_id)
    before = await taskward.get_task(db, task_id)
    assert await src.renew(task_id, task.lease_id) == STALE
    assert token.is_cancelled and "lost" in (token.reason or "")
    assert new.lease_id in (token.reason or "")
    assert await taskward.get_task(db, task_id) == before  # the new holder's lease untouched


# -- the host renews what it holds (ResidentEngineHost.renew_leases) -------------------------------


def host(
    src: LocalTaskSource,
    db: StateDB,
    run_task: Any,
    *,
    renew_every_s: float | None = 3600.0,  # the tests' own passes; None: the source's interval
    lease_lost_grace_s: float = 5.0,
) -> ResidentEngineHost:
    summaries = src.summary_store or LocalSummaryStore(db)
    return ResidentEngineHost(
        source=src,
        summaries=summaries,
        max_concurrent_tasks=1,  # a host busy with its task: it cannot take it back itself
        session_factory=TaskSession,
        run_task=run_task,
        idle_wait_s=0.02,
        renew_every_s=renew_every_s,
        lease_lost_grace_s=lease_lost_grace_s,
    )


@contextlib.asynccontextmanager
async def serving(h: ResidentEngineHost) -> AsyncIterator[asyncio.Task[None]]:
    serve = asyncio.ensure_future(h.serve())
    try:
        yield serve
    except BaseException:
        serve.cancel()
        await asyncio.wait({serve}, timeout=30)
        raise
    h.stop_claiming("test finished")
    await asyncio.wait_for(serve, 30)


async def facts(db: StateDB, task_id: str) -> list[tuple[str, str]]:
    return [
        (f["previous_status"], f["status"]) for f in await taskward.list_transitions(db, task_id)
    ]


async def stale_results(db: StateDB, task_id: str) -> list[dict[str, Any]]:
    events = await taskward.list_task_events(db, task_id)
    return [e for e in events if e["kind"] == "stale_result"]


@pytest.mark.parametrize("one_step", [False, True], ids=["two_steps", "one_step"])
async def test_the_owners_completion_after_renewals_applies_exactly_once(
    db: StateDB, one_step: bool
) -> None:
    task_id = await submit(db)
    src = source(db, one_step=one_step)
    started, release = asyncio.Event(), asyncio.Event()

    async def held(task: Task, session: Any) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {}

    h = host(src, db, held)
    async with serving(h) as serve:
        await wait_until(_set(started), "the task to run", serving=serve)
        claimed = (await taskward.get_task(db, task_id))["lease_expires_at"]
        assert await h.renew_leases() == 1
        assert await h.renew_leases() == 1
        renewed = (await taskward.get_task(db, task_id))["lease_expires_at"]
        assert renewed >= claimed
        assert src.claimed(task_id).lease.lease_expires_at == renewed
        release.set()
        await wait_until(_status(db, task_id, "completed"), "the completion", serving=serve)
    assert (h.stats.renewed, h.stats.leases_lost, h.stats.ack_rejected) == (2, 0, 0)
    assert h.stats.completed == 1
    assert await facts(db, task_id) == [("queued", "running"), ("running", "completed")]
    assert await stale_results(db, task_id) == []


async def test_a_run_whose_renewal_lost_is_cancelled_and_its_result_never_written(
    db: StateDB, tmp_path: Path
) -> None:
    """The run waits for its cancellation token (``until_cancelled``): the lost renewal cancels
    it cooperatively, and the refused acknowledgement is a ``stale_result`` event, no fact."""
    marker = tmp_path / "running"
    task_id = await submit(
        db,
        {"marker": str(marker), "timeout_s": TIMEOUT_S},
        kind="until_cancelled",
        registry=PY_REGISTRY,
    )
    src = source(db, registry=PY_REGISTRY)
    old_lease = f"{src.spec.worker_id}/1"
    h = host(src, db, AdapterRunner(PY_REGISTRY, src))
    async with serving(h) as serve:
        await wait_until(_exists(marker), "the task to run", serving=serve)
        new = await reclaim_elsewhere(db, task_id)
        assert await h.renew_leases() == 0
        assert h.stats.leases_lost == 1
        await wait_until(_idle(h), "the lost run to end", serving=serve)
    assert h.stats.ack_rejected == 1 and h.stats.failed == h.stats.completed == 0
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["leased_by"], row["lease_attempts"]) == (
        "running",
        "host:bbbbbbbb",
        2,
    )
    # a fact per change only: the lost run's end wrote none
    assert await facts(db, task_id) == [
        ("queued", "running"),
        ("running", "retry_wait"),
        ("retry_wait", "queued"),
        ("queued", "running"),
    ]
    [event] = await stale_results(db, task_id)
    assert event["payload"]["lease_id"] == old_lease
    assert event["payload"]["status"] == "cancelled"  # the adapter's own result, via its token
    assert "lost" in (event["payload"]["error_detail"] or "")
    # the new holder finishes it, once
    assert await source(db, "host:bbbbbbbb").fail(
        task_id, new.lease_id, TaskFailure(code="flow_failed", detail="x", retryable=False)
    ) == TaskAck(applied=True)
    assert (await taskward.get_task(db, task_id))["status"] == "failed"


async def test_a_lost_run_that_ignores_its_cancellation_is_stopped_after_the_grace(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    src = source(db)
    started = asyncio.Event()
    stopped: list[BaseException] = []

    async def stubborn(task: Task, session: Any) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.Event().wait()  # never looks at a token
        except BaseException as exc:
            stopped.append(exc)
            raise
        return {}

    h = host(src, db, stubborn, lease_lost_grace_s=0.05)
    async with serving(h) as serve:
        await wait_until(_set(started), "the task to run", serving=serve)
        await reclaim_elsewhere(db, task_id)
        assert await h.renew_leases() == 0
        await wait_until(_idle(h), "the lost run to be stopped", serving=serve)
    assert [type(exc) for exc in stopped] == [asyncio.CancelledError]
    assert h.stats.leases_lost == h.stats.ack_rejected == 1
    [event] = await stale_results(db, task_id)
    assert "lease lost" in (event["payload"]["error_detail"] or "")
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["leased_by"]) == ("running", "host:bbbbbbbb")


async def test_a_host_renews_a_renewing_sources_leases_on_its_own_while_serving(
    db: StateDB,
) -> None:
    """No interval given: the host takes the source's (``lease_ttl / 3``, 1 s at the shortest
    renewable ttl) and renews until the run ends; the run waits on the row, never on a sleep."""
    await submit(db)
    worker = WorkerSpec(
        worker_id="host:aaaaaaaa",
        kinds=REGISTRY.kinds(),
        lease_ttl=MIN_RENEWABLE_LEASE_TTL_SECONDS,
        lease_slack_s=SLACK_S,
        renews=True,
    )
    src = LocalTaskSource(db, worker, retry_policy=IMMEDIATE)
    seen: list[float] = []

    async def until_renewed(task: Task, session: Any) -> dict[str, Any]:
        first = (await taskward.get_task(db, task.id))["lease_expires_at"]

        async def renewed() -> bool:
            seen.append((await taskward.get_task(db, task.id))["lease_expires_at"])
            return seen[-1] > first

        await wait_until(renewed, "a renewal", timeout_s=10)
        return {}

    h = host(src, db, until_renewed, renew_every_s=None)
    async with serving(h) as serve:
        await wait_until(lambda: _done(h), "the completion", serving=serve, timeout_s=15)
    assert h.stats.completed == 1 and h.stats.renewed >= 1 and not h.stats.errors


def _set(event: asyncio.Event) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return event.is_set()

    return check


def _exists(path: Path) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return path.exists()

    return check


def _idle(h: ResidentEngineHost) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return h.active_count == 0

    return check


def _status(db: StateDB, task_id: str, wanted: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await taskward.get_task(db, task_id))["status"] == wanted

    return check


async def _done(h: ResidentEngineHost) -> bool:
    return h.stats.completed >= 1 and h.active_count == 0


async def test_a_lost_lease_is_counted_once_however_many_passes_run_before_the_run_stops(
    db: StateDB,
) -> None:
    """A run whose lease was found lost is not renewed again while it stops (its grace here
    outlasts the passes): one loss, one warning, however many renewal passes come meanwhile."""
    task_id = await submit(db)
    src = source(db)
    started = asyncio.Event()

    async def stubborn(task: Task, session: Any) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()  # never looks at a token
        return {}

    h = host(src, db, stubborn, lease_lost_grace_s=0.5)
    async with serving(h) as serve:
        await wait_until(_set(started), "the task to run", serving=serve)
        await reclaim_elsewhere(db, task_id)
        for _ in range(3):
            assert await h.renew_leases() == 0
        assert h.stats.leases_lost == 1
        await wait_until(_idle(h), "the lost run to be stopped", serving=serve)
    assert h.stats.leases_lost == h.stats.ack_rejected == 1
