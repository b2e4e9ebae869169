"""The StateDB port: the only storage surface services import.

A dialect implements it over named queries (``<dialect>/queries.sql``). Services never see a
driver, never branch on the URL, and get rows as dicts with JSON columns already decoded.
Driver errors are translated to ``StoreError`` / ``StoreUnavailable`` at this boundary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, Protocol

from taskward.store.signals import Signal

if TYPE_CHECKING:
    from taskward.metrics import TaskMetrics

Row = dict[str, Any]
Params = Mapping[str, Any]
RunUpdate = tuple[str, str, Mapping[str, Any], Mapping[str, Any]]
"""One compare-and-swap of a batch: ``(run_id, from_state, values, guard)``."""

# Columns stored as JSON; rows come back with them decoded on both dialects.
JSON_COLUMNS: Final[frozenset[str]] = frozenset(
    {
        "trigger_context",
        "action_args",
        "required_capabilities",
        "status_evidence_refs",
        "evidence_refs",
        "metadata",
        "payload",
        "advertised_capabilities",
        "execution_targets",
        "served_kinds",
        "summary",
        "body",  # dispatch_outbox
        "acked_targets",  # dispatch_outbox
    }
)

# Columns a guarded run update may set or compare (DESIGN.md R3: the patch allowlist includes
# invocation_id and deadline_at). The store re-checks these before building SQL.
RUN_PATCH_COLUMNS: Final[frozenset[str]] = frozenset(
    {
        "queued_at",
        "leased_by",
        "lease_expires_at",
        "lease_attempts",
        "ended_at",
        "exit_code",
        "error_detail",
        "retry_at",
        "cancel_requested_at",
        "cancel_requested_by",
        "invocation_id",
        "deadline_at",
    }
)
RUN_GUARD_COLUMNS: Final[frozenset[str]] = frozenset(
    {
        "leased_by",
        "lease_expires_at",
        "lease_attempts",
        "cancel_requested_at",
        "deadline_at",
        "retry_at",
    }
)
# Written by transition_task itself on every change, never by a caller's patch.
RUN_PROJECTION_COLUMNS: Final[frozenset[str]] = frozenset(
    {"status", "updated_at", "status_reason_code", "status_reason_summary", "status_evidence_refs"}
)


class KeyAlreadyUsed(Exception):
    """A transition's idempotency key already has a fact (ADR-0072 D3).

    Raised inside a transaction: by ``transitions`` when a fact inserted nothing, and by a
    one-statement batch (``claim_queued``, ``finish_running``) whose plain insert the unique
    index refused, which aborts the transaction. Either way the caller lets it roll back and
    answers with ``transitions.replayed_result`` (or runs each unit of a batch alone).
    """


class ConcurrencyKeyBusy(Exception):
    """A guarded update would run a second row with the same serialization key (R7).

    Raised inside a transaction; the caller lets the transaction roll back and reports a lost
    compare-and-swap.
    """


class Tx(Protocol):
    """One open transaction. ``now`` is this operation's time (R9)."""

    now: float

    async def execute(self, name: str, params: Params | None = None) -> int:
        """Run a named statement; returns the affected row count."""
        ...

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None: ...

    async def fetchall(self, name: str, params: Params | None = None) -> list[Row]: ...

    async def fetchone_each(self, name: str, params_list: Sequence[Params]) -> list[Row | None]:
        """Run a named statement once per parameter set (pipelined where the driver can);
        returns each run's first row, in order."""
        ...

    async def fetch_batch(self, statements: Sequence[tuple[str, Params]]) -> list[Row | None]:
        """Several named statements, in order, in as few round trips as the driver allows;
        returns each statement's first row (None when it returns none)."""
        ...

    async def fetchall_batch(self, statements: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """``fetch_batch`` returning every row of each statement."""
        ...

    async def write_many(self, statements: Sequence[tuple[str, Sequence[Params]]]) -> list[int]:
        """Write many rows per statement, the statements in order; returns, per statement, the
        rows it wrote (inserted, or updated by its upsert; a row its ON CONFLICT skipped counts
        0). Each ``<name>_many`` statement keeps its one-row counterpart's semantics per row.

        How is the dialect's: SQLite runs the statement once per row (``executemany``, in
        process: the cheapest way to SQLite, no JSON to build or parse); PostgreSQL runs it once
        over every row, each column passed as a binary array, all the statements in one round
        trip.
        Nothing is returned but counts: a caller that needs to know which row was skipped
        reads it back (a rare path: a used key, a summary already complete).
        """
        ...

    async def run_update_if(
        self,
        run_id: str,
        from_state: str,
        values: Mapping[str, Any],
        guard: Mapping[str, Any],
        returning: Sequence[str] = (),
    ) -> Row | None:
        """Compare-and-swap one run: set ``values`` where id, status and every guard match.

        A None guard value means IS NULL. Returns the ``returning`` columns of the updated row,
        or None when nothing matched. Raises ConcurrencyKeyBusy on a serialization-key clash.
        """
        ...

    async def run_update_many(
        self, items: Sequence[RunUpdate], returning: Sequence[str] = ()
    ) -> list[Row]:
        """Several compare-and-swaps of distinct runs in one statement, each matched on its own
        id, status and guard values (``guarded.build_run_update_many``; the items share one
        ``update_shape``). Returns ``id`` and the ``returning`` columns of the rows that
        matched, in no particular order. Raises ConcurrencyKeyBusy like ``run_update_if``.
        """
        ...

    def auditing(self) -> AuditingTx | None:
        """This transaction as an ``AuditingTx`` where its store can write a group's facts,
        events and notifications inside the group's compare-and-swap (PostgreSQL: data-modifying
        CTEs); None where it cannot (SQLite), and ``transitions.apply`` writes them with
        ``write_many`` after ``run_update_many``. Asked by ``transitions`` only."""
        ...

    def notify(self, channel: str) -> None:
        """Wake idle workers on ``channel`` ("queued", "cancel") once this transaction commits."""
        ...

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """A nested scope: an exception inside rolls back only the scope's writes."""
        ...


class AuditingTx(Tx, Protocol):
    """A ``Tx`` whose store runs a claim pass and a group's finish as one statement each, the
    audit rows written inside the compare-and-swap (PostgreSQL). Only ``transitions`` asks
    for it (``Tx.auditing``)."""

    async def finish_running(self, params: Mapping[str, Any]) -> list[Row]:
        """A group's terminal transitions out of ``running`` that share one outcome, in one
        statement (``transitions.finish`` builds ``params`` from a ``finish_template``): for
        each row, its guarded compare-and-swap under its lease, its fact, event and
        notification, the rows ``transitions.rows.audit_rows`` builds. Returns the changed rows'
        ``id``, ``fact_id``, ``event_id`` and ``fact_written``, in no particular order; a taken
        transition key raises ``KeyAlreadyUsed`` (the transaction is aborted)."""
        ...

    async def claim_queued(self, params: Mapping[str, Any]) -> list[Row]:
        """One claim pass in one statement (``transitions.claim.claim_call`` builds ``params``):
        the first page of claim candidates, locked, and for each row taken in page order its
        ``queued -> running`` compare-and-swap, lease, fact and event. Rows come in no
        particular order with their place (``claim_k``), ``fact_written``, and the page's
        ``page_rows``, ``keyed`` and ``stale``; a pass that took nothing returns one row of
        these three alone. A taken transition key raises ``KeyAlreadyUsed``."""
        ...

    async def together(
        self,
        writes: Sequence[tuple[str, Sequence[Params]]],
        finishes: Sequence[Mapping[str, Any]],
        claims: Sequence[Mapping[str, Any]],
    ) -> tuple[list[int], list[list[Row]], list[list[Row]]]:
        """``write_many(writes)``, then ``finish_running`` for each of ``finishes``, then
        ``claim_queued`` for each of ``claims``, in that order and in one round trip: what
        each would have answered. The statements run one after another as if sent alone; an
        error in one aborts the transaction (a taken transition key raises
        ``KeyAlreadyUsed``)."""
        ...


class StateDB(Protocol):
    """A taskward store. Open with ``taskward.open_db(url)``."""

    dialect: str
    url: str
    supports_listen_notify: bool
    concurrent_writers: bool
    """Whether several write transactions may be in flight at once (PostgreSQL; SQLite has one
    writer): what a service asks instead of the dialect (``groupcommit``'s lanes)."""
    metrics: TaskMetrics | None
    """This process's metrics, recorded by the services that use this store (``taskward.metrics``);
    None (the default) records nothing. Set by its owner: ``WorkerRuntime``, ``create_app``."""

    def transaction(self, *, now: float | None = None) -> AbstractAsyncContextManager[Tx]:
        """Open a write transaction; ``now`` None means the store's clock (R9)."""
        ...

    async def execute(self, name: str, params: Params | None = None) -> int:
        """Run a named statement in its own transaction; returns its row count (the rows an
        INSERT or UPDATE wrote, or a SELECT returned), the rows themselves left unread."""
        ...

    async def fetchone(self, name: str, params: Params | None = None) -> Row | None: ...

    async def fetchall(self, name: str, params: Params | None = None) -> list[Row]: ...

    def wake(self, channel: str) -> None:
        """Wake this process's waiters on ``channel`` now (after a write made outside
        ``transaction()``, whose SQL notifies other processes itself)."""
        ...

    def signal(self, channel: str) -> Signal:
        """The wake-up signal of ``channel``; starts watching other processes on first use."""
        ...

    async def now(self) -> float:
        """The store's clock: PostgreSQL's on PostgreSQL, the local clock on SQLite."""
        ...

    async def migrate(self) -> list[str]:
        """Apply pending migrations under a lock; returns the names applied."""
        ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> StateDB: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SyncStatements(Protocol):
    """The synchronous client's store (``taskward.client.SyncClient``; open with
    ``store.open.open_sync_db``): named single statements, each its own transaction, called
    from any thread of a program without an event loop. Driver errors are translated as the
    async store translates them."""

    dialect: str
    url: str

    def execute(self, name: str, params: Params | None = None) -> int:
        """As ``StateDB.execute``."""
        ...

    def fetchone(self, name: str, params: Params | None = None) -> Row | None: ...

    def fetchall(self, name: str, params: Params | None = None) -> list[Row]: ...

    def schema_version(self) -> int:
        """The newest migration applied to the store (0: none)."""
        ...

    def close(self) -> None:
        """Close every connection this process opened; safe to call twice."""
        ...
