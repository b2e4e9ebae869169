"""The invariant checker (issue 8) on both backends: sound stores report nothing, and each
invariant, broken on purpose, is reported under its own code.

Corruptions go through a raw driver connection (sqlite3 / psycopg), never through taskward.
Facts refuse UPDATE and DELETE, so a corruption of a fact runs with the append-only triggers
dropped (SQLite) or disabled (PostgreSQL) and restored at once; the append-only check itself is
broken by swapping ``status_transitions`` for a fresh copy of the table without its triggers.
Time is injected (``T0`` lies in the future, so summaries written on the store's clock precede
the facts that cite them).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

import taskward
from taskward import Actor, TaskExecutionResult
from taskward.adapters import AdapterConfig, build_registry
from taskward.checker import CODES, InvariantsViolated, assert_invariants, check_invariants
from taskward.claims import Lease, WorkerSpec, claim_runs
from taskward.execution import RetryPolicy, settle_lease
from taskward.host import (
    AdapterRunner,
    LocalSummaryStore,
    LocalTaskSource,
    ResidentEngineHost,
    SessionSummary,
    TaskResult,
    TaskSession,
)
from taskward.maintenance.reaper import promote_due_retries, reap_expired_leases
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB
from taskward.testing import wait_until

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true", "false"})))
NO_JITTER = RetryPolicy(base_s=10.0, factor=2.0, cap_s=100.0, jitter=0.0)
IMMEDIATE = RetryPolicy(base_s=0.0, jitter=0.0)
OPERATOR = Actor(type="operator", id="checker-test")
T0 = time.time() + 3600.0
CHECK_AT = T0 + 500.0  # C's lease (claimed at T0 + 404, 300 s) is still live


async def submit(
    db: StateDB,
    *,
    argv: list[str] | None = None,
    now: float | None = None,
    depends_on: tuple[str, ...] = (),
) -> str:
    app = taskward.TaskApplication(
        action_kind="command",
        args={"argv": argv or ["true"]},
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
        depends_on=list(depends_on),
    )
    return await taskward.submit_task(db, app, registry=REGISTRY, now=now)


def spec(worker_id: str = "host:checker1") -> WorkerSpec:
    return WorkerSpec(worker_id=worker_id, kinds=REGISTRY.kinds())


async def claim_one(db: StateDB, worker: WorkerSpec, *, now: float) -> Lease:
    [lease] = await claim_runs(db, worker, limit=1, now=now)
    return lease


async def write_summary(db: StateDB, lease: Lease) -> None:
    key = f"{lease.task_id}:{lease.attempt}"
    summary = SessionSummary(
        facts={"task_id": lease.task_id, "attempt": lease.attempt},
        narrative=None,
        manifest_ref=f"taskward:schedule_runs/{lease.task_id}?attempt={lease.attempt}",
    )
    await LocalSummaryStore(db).write(key, summary)


async def settle(db: StateDB, lease: Lease, status: str = "completed", **result: Any) -> bool:
    """The owner's terminal write, with the summary first when it completes (ADR-0037 D4)."""
    if status == "completed":
        await write_summary(db, lease)
    transition = await settle_lease(
        db,
        lease,
        TaskExecutionResult(status=status, **result),  # type: ignore[arg-type]
        actor=Actor(type="system", id=lease.leased_by),
        max_attempts=3,
        policy=NO_JITTER,
        now=lease.claimed_at + 1,
    )
    return transition.applied


async def keys_of(db: StateDB, *task_ids: str) -> dict[str, str]:
    return {(await taskward.get_task(db, t))["idempotency_key"]: t for t in task_ids}


# -- a raw connection beside taskward -------------------------------------------------------


class Raw:
    """A driver connection to the same store, for breaking it on purpose."""

    def __init__(self, url: str) -> None:
        self.is_pg = not url.startswith("sqlite")
        self.conn: Any = (
            psycopg.connect(url, autocommit=True)
            if self.is_pg
            else sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        )

    def run(self, sql: str, *params: object) -> None:
        self.conn.execute(sql.replace("?", "%s") if self.is_pg else sql, params)

    def value(self, sql: str, *params: object) -> Any:
        row = self.conn.execute(sql.replace("?", "%s") if self.is_pg else sql, params).fetchone()
        return row[0] if row else None

    def facts(self, sql: str, *params: object) -> None:
        """Run ``sql`` with the append-only triggers of status_transitions out of the way."""
        if self.is_pg:
            self.run("ALTER TABLE status_transitions DISABLE TRIGGER USER")
            try:
                self.run(sql, *params)
            finally:
                self.run("ALTER TABLE status_transitions ENABLE TRIGGER USER")
            return
        triggers = self.conn.execute(
            "SELECT name, sql FROM sqlite_master "
            "WHERE type = 'trigger' AND tbl_name = 'status_transitions'"
        ).fetchall()
        for name, _ in triggers:
            self.run(f"DROP TRIGGER {name}")
        try:
            self.run(sql, *params)
        finally:
            for _, create in triggers:
                self.run(create)

    def insertable_columns(self, table: str) -> list[str]:
        """The columns of ``table`` an INSERT may name, in table order: not the generated ones
        (``schedule_runs.claim_rank``), which ``SELECT *`` returns but no INSERT may set."""
        if self.is_pg:
            rows = self.conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = %s "
                "AND is_generated = 'NEVER' ORDER BY ordinal_position",
                (table,),
            ).fetchall()
            return [name for (name,) in rows]
        # table_xinfo's hidden: 2 and 3 mark generated columns (virtual, stored)
        rows = self.conn.execute(f"PRAGMA table_xinfo({table})").fetchall()
        return [row[1] for row in rows if row[6] not in (2, 3)]

    def clone(self, table: str, where: str, *params: object, **changes: str) -> None:
        """Insert a copy of the rows of ``table`` matching ``where`` with column ``changes``
        (SQL expressions over the copied row); it lands last in insertion order."""
        self.run("DROP TABLE IF EXISTS tw_clone")
        self.run(f"CREATE TEMP TABLE tw_clone AS SELECT * FROM {table} WHERE {where}", *params)
        overriding = ""
        if self.is_pg and table in {"status_transitions", "task_events"}:
            changes = {"seq": "seq + 1000000", **changes}
            overriding = "OVERRIDING SYSTEM VALUE"
        sets = ", ".join(f"{column} = {expr}" for column, expr in changes.items())
        self.run(f"UPDATE tw_clone SET {sets}")
        columns = ", ".join(self.insertable_columns(table))
        self.run(f"INSERT INTO {table} ({columns}) {overriding} SELECT {columns} FROM tw_clone")
        self.run("DROP TABLE tw_clone")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def raw(db_url: str) -> Iterator[Raw]:
    connection = Raw(db_url)
    yield connection
    connection.close()


# -- a small sound store ------------------------------------------------------------------------


@dataclass
class Scenario:
    """A: completed (one claim); B: queued; C: running with a live lease; D: cancelled while
    queued; E: reaped once, requeued, claimed again and completed (two claims)."""

    a: str
    b: str
    c: str
    d: str
    e: str
    acknowledged: dict[str, str] = field(default_factory=dict)


@pytest.fixture
async def scenario(db: StateDB) -> Scenario:
    e = await submit(db, now=T0)
    first = await claim_one(db, spec(), now=T0 + 1)
    await reap_expired_leases(db, now=first.lease_expires_at + 1, retry_policy=NO_JITTER)
    a = await submit(db, now=T0 + 400)
    assert await settle(db, await claim_one(db, spec(), now=T0 + 401))
    c = await submit(db, now=T0 + 403)
    assert (await claim_one(db, spec(), now=T0 + 404)).task_id == c
    d = await submit(db, now=T0 + 405)
    await taskward.request_task_cancel(db, d, actor=OPERATOR, idempotency_key="c", now=T0 + 406)
    await promote_due_retries(db, now=T0 + 407)
    second = await claim_one(db, spec("host:checker2"), now=T0 + 408)
    assert second.task_id == e and second.attempt == 2
    assert await settle(db, second)
    b = await submit(db, now=T0 + 410)
    return Scenario(a, b, c, d, e, acknowledged=await keys_of(db, a, b, c, d, e))


async def codes(db: StateDB, **options: Any) -> set[str]:
    return {v.code for v in await check_invariants(db, now=CHECK_AT, **options)}


# -- sound stores -------------------------------------------------------------------------------


async def test_a_sound_store_has_no_violations(db: StateDB, scenario: Scenario) -> None:
    assert await check_invariants(db, acknowledged=scenario.acknowledged, now=CHECK_AT) == []
    assert [f["status"] for f in await taskward.list_transitions(db, scenario.e)] == [
        "running",
        "retry_wait",
        "queued",
        "running",
        "completed",
    ]


async def test_an_empty_store_has_no_violations(db: StateDB) -> None:
    assert await check_invariants(db) == []


async def test_a_resident_host_workload_keeps_every_invariant(db: StateDB) -> None:
    """Claims, summaries and acknowledgements through the resident host (ADR-0037), on the
    store's clock: a run that acknowledges before its summary is durable breaks D4."""
    ok = [await submit(db) for _ in range(4)]
    bad = [await submit(db, argv=["false"]) for _ in range(2)]
    worker = WorkerSpec(worker_id="host:hostrun1", kinds=REGISTRY.kinds(), lease_ttl=60.0)
    source = LocalTaskSource(db, worker, retry_policy=IMMEDIATE)
    host = ResidentEngineHost(
        source=source,
        summaries=LocalSummaryStore(db),
        max_concurrent_tasks=3,
        session_factory=TaskSession,
        run_task=AdapterRunner(REGISTRY, source),
        idle_wait_s=0.02,
    )
    serve = asyncio.ensure_future(host.serve())

    async def settled() -> bool:
        rows = [await taskward.get_task(db, t) for t in ok + bad]
        return all(r["status"] in {"completed", "failed"} for r in rows)

    try:
        await wait_until(settled, "every task settled", timeout_s=30, serving=serve)
    finally:
        host.stop_claiming("test finished")
        await asyncio.wait_for(serve, 10)
    assert {(await taskward.get_task(db, t))["status"] for t in ok} == {"completed"}
    await assert_invariants(db, acknowledged=await keys_of(db, *ok, *bad))


async def test_a_stale_owner_after_reclaim_keeps_every_invariant(db: StateDB) -> None:
    """R4: the first owner's late writes (worker functions and host acknowledgement alike) are
    refused once the row was reaped and reclaimed; the new owner's completion is the one fact."""
    task_id = await submit(db, now=T0)
    stale = await claim_one(db, spec("host:stale001"), now=T0)
    late = stale.lease_expires_at + 1
    await reap_expired_leases(db, now=late, retry_policy=NO_JITTER)
    await promote_due_retries(db, now=late + 100)
    fresh = await claim_one(db, spec("host:fresh001"), now=late + 100)
    assert not await settle(db, stale, "completed")
    assert not await settle(db, stale, "failed", exit_code=1)
    source = LocalTaskSource(db, spec("host:stale001"))
    key = f"{task_id}:{stale.attempt}"
    ack = await source.complete(
        task_id, stale.lease_id, TaskResult(run_id=key, status="completed", summary_ref=key)
    )
    assert not ack.applied and ack.rejection == "stale_lease"
    assert await settle(db, fresh)
    await assert_invariants(db, now=late + 200)


async def test_expiry_at_the_ceiling_keeps_every_invariant(db: StateDB) -> None:
    """R6: a lease that expires on the last attempt fails the task; nothing is left queued at
    the ceiling, where no claim would ever select it."""
    await set_max_attempts(db, 2)
    task_id = await submit(db, now=T0)
    now = T0
    for _ in range(2):
        await promote_due_retries(db, now=now)
        lease = await claim_one(db, spec(), now=now)
        now = lease.lease_expires_at + 1
        await reap_expired_leases(db, now=now, retry_policy=NO_JITTER)
        now += 1000
    await promote_due_retries(db, now=now)
    assert (await taskward.get_task(db, task_id))["status"] == "failed"
    await assert_invariants(db, now=now)


async def test_worker_functions_keep_every_invariant_but_write_no_summary(db: StateDB) -> None:
    """The ADR-0071 tick completes without a summary: held to everything else."""
    ids = [await submit(db, now=T0) for _ in range(3)]
    ids.append(await submit(db, argv=["false"], now=T0))
    await taskward.worker_tick(db, worker_id="host:tick0001", registry=REGISTRY, now=T0 + 1)
    assert (
        await check_invariants(
            db, acknowledged=await keys_of(db, *ids), now=T0 + 2, require_summaries=False
        )
        == []
    )


async def test_assert_invariants_lists_what_broke(
    db: StateDB, scenario: Scenario, raw: Raw
) -> None:
    raw.run("DELETE FROM task_summaries WHERE task_id = ?", scenario.a)
    with pytest.raises(InvariantsViolated) as caught:
        await assert_invariants(db, now=CHECK_AT)
    assert [v.code for v in caught.value.violations] == ["summary_missing"]
    assert f"summary_missing task {scenario.a}" in str(caught.value)


# -- each invariant, broken on purpose ----------------------------------------------------------

Corruption = Callable[[Raw, Scenario], None]


def _last_fact(s: Scenario, task: str) -> str:
    return f"entity_id = '{task}' AND status = 'completed'"


def duplicate_key(raw: Raw, s: Scenario) -> None:
    raw.run("DROP INDEX idx_schedule_runs_idempotency")
    raw.clone("schedule_runs", "id = ?", s.b, id="'dup-' || id")


def acknowledged_row_deleted(raw: Raw, s: Scenario) -> None:
    raw.run("DELETE FROM schedule_runs WHERE id = ?", s.b)


def acknowledged_row_renamed(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE schedule_runs SET id = 'renamed' WHERE id = ?", s.b)


def terminal_row_deleted(raw: Raw, s: Scenario) -> None:
    raw.run("DELETE FROM schedule_runs WHERE id = ?", s.d)


def lease_expired_unreaped(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE schedule_runs SET lease_expires_at = ? WHERE id = ?", CHECK_AT - 1, s.c)


def owner_cleared(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE schedule_runs SET leased_by = NULL WHERE id = ?", s.c)


def status_without_fact(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE schedule_runs SET status = 'retry_wait' WHERE id = ?", s.c)


def first_fact_not_from_queued(raw: Raw, s: Scenario) -> None:
    raw.facts(
        "UPDATE status_transitions SET previous_status = 'retry_wait' WHERE entity_id = ?", s.d
    )


def fact_leaves_another_state(raw: Raw, s: Scenario) -> None:
    raw.facts(
        "UPDATE status_transitions SET previous_status = 'waiting_dependency' "
        "WHERE entity_id = ? AND status = 'queued'",
        s.e,
    )


def undeclared_edge(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE schedule_runs SET status = 'failed' WHERE id = ?", s.d)
    raw.facts("UPDATE status_transitions SET status = 'failed' WHERE entity_id = ?", s.d)
    raw.run(
        "UPDATE task_events SET status = 'failed' WHERE task_id = ? AND kind = 'transition'", s.d
    )


def second_terminal_fact(raw: Raw, s: Scenario) -> None:
    where = _last_fact(s, s.a)
    raw.clone(
        "status_transitions",
        where,
        id="'f2'",
        event_id="'e2'",
        idempotency_key="'again'",
    )
    raw.clone(
        "task_events",
        f"transition_id IN (SELECT id FROM status_transitions WHERE {where} AND id <> 'f2')",
        id="'e2'",
        transition_id="'f2'",
    )
    raw.clone(
        "dispatch_outbox",
        "schedule_run_id = ?",
        s.a,
        id="'o2'",
        dedup_key="'task-terminal:f2'",
        transition_id="'f2'",
    )


def terminal_row_touched(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE schedule_runs SET updated_at = updated_at + 5 WHERE id = ?", s.a)


def event_lost(raw: Raw, s: Scenario) -> None:
    raw.run(
        "DELETE FROM task_events WHERE transition_id IN "
        f"(SELECT id FROM status_transitions WHERE {_last_fact(s, s.a)})"
    )


def event_names_no_fact(raw: Raw, s: Scenario) -> None:
    raw.clone(
        "task_events",
        "task_id = ? AND kind = 'transition' AND status = 'cancelled'",
        s.d,
        id="'ghost-event'",
        transition_id="'ghost-fact'",
    )


def actor_erased(raw: Raw, s: Scenario) -> None:
    raw.facts("UPDATE status_transitions SET actor = NULL WHERE entity_id = ?", s.d)


def reason_unknown(raw: Raw, s: Scenario) -> None:
    raw.facts("UPDATE status_transitions SET reason_code = 'because' WHERE entity_id = ?", s.d)


def attempts_rewritten(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE schedule_runs SET lease_attempts = 2 WHERE id = ?", s.c)


def claim_lease_rewritten(raw: Raw, s: Scenario) -> None:
    raw.facts(
        "UPDATE status_transitions SET lease_id = 'host:checker1/7' "
        "WHERE entity_id = ? AND status = 'running'",
        s.c,
    )


def completed_by_another_lease(raw: Raw, s: Scenario) -> None:
    raw.facts(
        "UPDATE status_transitions SET lease_id = 'host:intruder/1', "
        f"idempotency_key = 'finish:host:intruder/1' WHERE {_last_fact(s, s.a)}"
    )


def completed_by_a_stale_presenter(raw: Raw, s: Scenario) -> None:
    # the guarded lease is right, but the writer presented the first claim's lease
    raw.facts(
        "UPDATE status_transitions SET idempotency_key = 'finish:host:checker1/1' "
        f"WHERE {_last_fact(s, s.e)}"
    )


def reaped_under_another_attempt(raw: Raw, s: Scenario) -> None:
    raw.facts(
        "UPDATE status_transitions SET idempotency_key = 'reap:' || entity_id || ':2' "
        "WHERE entity_id = ? AND status = 'retry_wait'",
        s.e,
    )


def own_ceiling_lowered_below_work(raw: Raw, s: Scenario) -> None:
    # R18: each row is judged by its own stored ceiling; E took two attempts
    raw.run("UPDATE schedule_runs SET max_attempts = 1 WHERE id = ?", s.e)


def summary_deleted(raw: Raw, s: Scenario) -> None:
    raw.run("DELETE FROM task_summaries WHERE task_id = ?", s.a)


def summary_left_pending(raw: Raw, s: Scenario) -> None:
    raw.run(
        "UPDATE task_summaries SET state = 'pending', summary = NULL, summary_hash = NULL "
        "WHERE task_id = ?",
        s.e,
    )


def summary_rewritten_later(raw: Raw, s: Scenario) -> None:
    raw.run("UPDATE task_summaries SET updated_at = ? WHERE task_id = ?", T0 + 10_000, s.a)


def outbox_row_lost(raw: Raw, s: Scenario) -> None:
    raw.run("DELETE FROM dispatch_outbox WHERE schedule_run_id = ?", s.d)


def outbox_row_doubled(raw: Raw, s: Scenario) -> None:
    raw.clone("dispatch_outbox", "schedule_run_id = ?", s.a, id="'o2'", dedup_key="'resend:o2'")


def outbox_row_for_no_fact(raw: Raw, s: Scenario) -> None:
    raw.clone(
        "dispatch_outbox",
        "schedule_run_id = ?",
        s.a,
        id="'o3'",
        dedup_key="'task-terminal:ghost'",
        transition_id="'ghost'",
    )


def facts_table_without_triggers(raw: Raw, s: Scenario) -> None:
    if raw.is_pg:
        raw.run("CREATE TABLE tw_copy (LIKE status_transitions INCLUDING ALL)")
        raw.run("INSERT INTO tw_copy OVERRIDING SYSTEM VALUE SELECT * FROM status_transitions")
        next_seq = raw.value("SELECT COALESCE(max(seq), 0) + 1 FROM status_transitions")
        raw.run(f"ALTER TABLE tw_copy ALTER COLUMN seq RESTART WITH {int(next_seq)}")
    else:
        raw.run("CREATE TABLE tw_copy AS SELECT * FROM status_transitions ORDER BY rowid")
    raw.run("DROP TABLE status_transitions")
    raw.run("ALTER TABLE tw_copy RENAME TO status_transitions")


CORRUPTIONS: dict[str, tuple[Corruption, set[str]]] = {
    "duplicate_key": (duplicate_key, {"duplicate_idempotency_key"}),
    "acknowledged_row_deleted": (acknowledged_row_deleted, {"acknowledged_admission_missing"}),
    "acknowledged_row_renamed": (acknowledged_row_renamed, {"acknowledged_admission_mismatch"}),
    "lease_expired_unreaped": (lease_expired_unreaped, {"running_without_lease"}),
    "owner_cleared": (owner_cleared, {"running_without_lease"}),
    "status_without_fact": (status_without_fact, {"status_mismatch"}),
    "first_fact_not_from_queued": (first_fact_not_from_queued, {"chain_start"}),
    "fact_leaves_another_state": (fact_leaves_another_state, {"chain_broken"}),
    "undeclared_edge": (undeclared_edge, {"undeclared_edge"}),
    # exactly-one-terminal is implied by the chain (terminal states have no exits), so a second
    # terminal fact always breaks the chain too
    "second_terminal_fact": (second_terminal_fact, {"terminal_fact_count", "chain_broken"}),
    "terminal_row_touched": (terminal_row_touched, {"terminal_row_changed"}),
    "event_lost": (event_lost, {"fact_event_mismatch"}),
    "event_names_no_fact": (event_names_no_fact, {"fact_event_mismatch"}),
    "actor_erased": (actor_erased, {"fact_without_actor"}),
    "reason_unknown": (reason_unknown, {"fact_without_reason"}),
    "attempts_rewritten": (attempts_rewritten, {"attempt_mismatch"}),
    "claim_lease_rewritten": (claim_lease_rewritten, {"attempt_mismatch"}),
    "completed_by_another_lease": (completed_by_another_lease, {"lease_not_current"}),
    "completed_by_a_stale_presenter": (completed_by_a_stale_presenter, {"lease_not_current"}),
    "reaped_under_another_attempt": (reaped_under_another_attempt, {"lease_not_current"}),
    "own_ceiling_lowered_below_work": (own_ceiling_lowered_below_work, {"attempts_above_ceiling"}),
    "summary_deleted": (summary_deleted, {"summary_missing"}),
    "summary_left_pending": (summary_left_pending, {"summary_missing"}),
    "summary_rewritten_later": (summary_rewritten_later, {"summary_after_completion"}),
    "outbox_row_lost": (outbox_row_lost, {"outbox_missing"}),
    "outbox_row_doubled": (outbox_row_doubled, {"outbox_duplicate"}),
    "outbox_row_for_no_fact": (outbox_row_for_no_fact, {"outbox_orphan"}),
    "facts_table_without_triggers": (facts_table_without_triggers, {"facts_mutable"}),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
async def test_each_broken_invariant_is_reported_under_its_code(
    db: StateDB, scenario: Scenario, raw: Raw, case: str
) -> None:
    corrupt, expected = CORRUPTIONS[case]
    corrupt(raw, scenario)
    assert await codes(db, acknowledged=scenario.acknowledged) == expected


async def test_a_deleted_run_orphans_its_facts(db: StateDB, scenario: Scenario, raw: Raw) -> None:
    terminal_row_deleted(raw, scenario)
    assert await codes(db) == {"fact_without_run"}
    assert await codes(db, acknowledged=scenario.acknowledged) == {
        "fact_without_run",
        "acknowledged_admission_missing",
    }


async def test_an_idle_row_at_the_ceiling_is_stranded(db: StateDB, raw: Raw) -> None:
    task_id = await submit(db, now=T0)
    lease = await claim_one(db, spec(), now=T0)
    assert await settle(db, lease, "failed", retryable=True)
    await promote_due_retries(db, now=T0 + 100)
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert await codes(db) == set()
    # R18: the queue's setting no longer reaches a stored row; only a row's own ceiling does
    raw.run("UPDATE queue_settings SET value = '1' WHERE name = 'max_attempts'")
    assert await codes(db) == set()
    raw.run("UPDATE schedule_runs SET max_attempts = 1 WHERE id = ?", task_id)
    assert await codes(db) == {"stranded_at_ceiling"}


async def test_purged_outbox_rows_are_not_missing(
    db: StateDB, scenario: Scenario, raw: Raw
) -> None:
    outbox_row_lost(raw, scenario)
    assert await codes(db, outbox_purged=True) == set()


async def test_a_store_without_the_outbox_table_skips_the_outbox_check(
    db: StateDB, scenario: Scenario, raw: Raw
) -> None:
    raw.run("DROP TABLE dispatch_outbox")
    assert await codes(db) == set()


async def test_the_append_only_probe_leaves_nothing_behind(db: StateDB, scenario: Scenario) -> None:
    before = await db.fetchall("fact_count_by_edge")
    assert await codes(db) == set()
    assert await db.fetchall("fact_count_by_edge") == before


async def test_without_required_summaries_only_cited_summaries_are_checked(
    db: StateDB, scenario: Scenario, raw: Raw
) -> None:
    summary_deleted(raw, scenario)
    assert await codes(db, require_summaries=False) == set()
    raw.facts(
        "UPDATE status_transitions SET evidence_refs = ? WHERE " + _last_fact(scenario, scenario.a),
        '[{"kind": "summary", "session_key": "x"}]',
    )
    assert await codes(db, require_summaries=False) == {"summary_missing"}


async def test_dependencies_unsettled_unlinked_or_overtaken_are_reported(
    db: StateDB, scenario: Scenario, raw: Raw
) -> None:
    """R21: a waiting task after its dependency ended (a settle lost), one with no links, and a
    task that ran before its dependency completed."""
    waiting = await submit(db, now=T0 + 5, depends_on=(scenario.b,))
    assert await codes(db) == set()
    raw.run("UPDATE schedule_runs SET status = 'cancelled' WHERE id = ?", scenario.b)
    assert await codes(db) == {"dependency_unsettled", "status_mismatch", "terminal_fact_count"}
    raw.run("UPDATE schedule_runs SET status = 'queued' WHERE id = ?", scenario.b)
    raw.run("DELETE FROM task_dependencies WHERE task_id = ?", waiting)
    assert await codes(db) == {"waiting_without_dependencies"}
    raw.run(
        "INSERT INTO task_dependencies (task_id, depends_on_id, created_at) VALUES (?, ?, ?)",
        waiting,
        scenario.b,
        T0,
    )
    # A ran (claimed, completed) although B, linked as its dependency now, never completed
    raw.run(
        "INSERT INTO task_dependencies (task_id, depends_on_id, created_at) VALUES (?, ?, ?)",
        scenario.a,
        scenario.b,
        T0,
    )
    found = await check_invariants(db, now=CHECK_AT)
    assert [(v.code, v.task_id, v.detail) for v in found] == [
        (
            "started_before_dependency",
            scenario.a,
            f"claimed before dependency {scenario.b} completed",
        )
    ]


def test_every_code_is_exercised() -> None:
    covered = set().union(*(expected for _, expected in CORRUPTIONS.values()))
    covered |= {"fact_without_run", "stranded_at_ceiling"}
    covered |= {"dependency_unsettled", "waiting_without_dependencies", "started_before_dependency"}
    assert covered == set(CODES)


# -- scale ----------------------------------------------------------------------------------


async def test_twenty_thousand_tasks_check_in_seconds(
    db: StateDB, scenario: Scenario, raw: Raw
) -> None:
    """10,000 copies each of A (one claim) and E (two claims, a reap): ~80,000 facts."""
    copies = 10_000
    if raw.is_pg:
        series = f"generate_series(1, {copies}) AS s(n)"
        prefix = ""
    else:
        series = "s"
        prefix = (
            f"WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {copies}) "
        )
    ids = (scenario.a, scenario.e)
    suffix = "'-' || CAST(s.n AS TEXT)"
    plans = {
        "schedule_runs": (
            "id",
            {"id": f"id || {suffix}", "idempotency_key": f"idempotency_key || {suffix}"},
        ),
        "status_transitions": (
            "entity_id",
            {
                "id": f"id || {suffix}",
                "entity_id": f"entity_id || {suffix}",
                "event_id": f"event_id || {suffix}",
                # reaper keys name the task: reap:<task>:<attempt>
                "idempotency_key": f"replace(idempotency_key, entity_id, entity_id || {suffix})",
            },
        ),
        "task_events": (
            "task_id",
            {
                "id": f"id || {suffix}",
                "task_id": f"task_id || {suffix}",
                "transition_id": f"transition_id || {suffix}",
            },
        ),
        "dispatch_outbox": (
            "schedule_run_id",
            {
                "id": f"id || {suffix}",
                "dedup_key": f"dedup_key || {suffix}",
                "schedule_run_id": f"schedule_run_id || {suffix}",
                "transition_id": f"transition_id || {suffix}",
            },
        ),
        "task_summaries": (
            "task_id",
            {
                "session_key": f"task_id || {suffix} || ':' || CAST(attempt AS TEXT)",
                "task_id": f"task_id || {suffix}",
            },
        ),
    }
    for table, (key, changes) in plans.items():
        columns = [c for c in raw.insertable_columns(table) if c != "seq"]
        exprs = ", ".join(changes.get(c, c) for c in columns)
        # copies keep each task's facts in their insertion order
        if not raw.is_pg:
            order = "s.n, t.rowid"
        elif table in {"status_transitions", "task_events"}:
            order = "s.n, t.seq"
        else:
            order = "s.n"
        raw.run(
            f"{prefix}INSERT INTO {table} ({', '.join(columns)}) SELECT {exprs} "
            f"FROM {table} t, {series} WHERE t.{key} IN (?, ?) ORDER BY {order}",
            *ids,
        )
    assert raw.value("SELECT count(*) FROM schedule_runs") == 2 * copies + 5
    started = time.perf_counter()
    violations = await check_invariants(db, acknowledged=scenario.acknowledged, now=CHECK_AT)
    elapsed = time.perf_counter() - started
    assert violations == []
    # A guard against a check that grows quadratically with the store (minutes at this size),
    # not a speed measurement: it must hold on a loaded two-core machine too.
    assert elapsed < 60.0, f"checking {2 * copies} tasks took {elapsed:.1f}s"
