"""The worker functions (ADR-0071 D4/D5, ADR-0072 D4/D5, R4-R7) on both backends, time injected."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pytest

import taskward
from taskward import Actor, TaskExecutionResult
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import Lease, WorkerSpec, _page_params, claim_rows, claim_runs
from taskward.claims.pages import START
from taskward.execution import RetryPolicy, execute_lease, settle_lease
from taskward.groupcommit import GroupCommit
from taskward.maintenance.reaper import promote_due_retries, reap_deadlines
from taskward.registry import CancellationToken, TaskAdapterRegistry
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB

MODULE = "tests.integration.worker_tasks"
REGISTRY = build_registry(
    AdapterConfig(
        python_modules=frozenset({MODULE}),
        imports=(MODULE,),
        command_allowlist=frozenset({"true", "false"}),
    )
)
NO_JITTER = RetryPolicy(base_s=10.0, factor=2.0, cap_s=100.0, jitter=0.0)
T0 = 1_000_000.0
PAGE_AT = T0 + 1000  # a claim page read here sees every row these tests queue (R16: due rows)


async def submit(
    db: StateDB, kind: str = "noop", args: dict | None = None, *, now: float = T0, **fields: object
) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args or {},
        execution_target=fields.pop("target", "host"),  # type: ignore[arg-type]
        idempotency_key=f"k-{uuid.uuid4()}",
        **fields,
    )  # type: ignore[arg-type]
    return await taskward.submit_task(db, app, registry=REGISTRY, now=now)


def spec(worker_id: str = "host:aaaaaaaa", **changes: object) -> WorkerSpec:
    values: dict[str, object] = {"worker_id": worker_id, "kinds": REGISTRY.kinds()}
    values.update(changes)
    return WorkerSpec(**values)  # type: ignore[arg-type]


async def status(db: StateDB, task_id: str) -> str:
    return str((await taskward.get_task(db, task_id))["status"])


async def statuses(db: StateDB, task_id: str) -> list[str]:
    return [f["status"] for f in await taskward.list_transitions(db, task_id)]


# -- heartbeats and the tick ----------------------------------------------------------------


async def test_tick_heartbeats_then_claims_and_completes(db: StateDB) -> None:
    task_id = await submit(db)
    counts = await taskward.worker_tick(db, worker_id="host:00000001", registry=REGISTRY, now=T0)
    assert counts["executed"] == 1
    worker = await db.fetchone("worker_get", {"worker_id": "host:00000001"})
    assert worker is not None and worker["last_heartbeat_at"] == T0
    assert worker["execution_targets"] == ["host"]
    assert "noop" in worker["served_kinds"]
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "completed" and row["exit_code"] == 0 and row["ended_at"] == T0
    assert await statuses(db, task_id) == ["running", "completed"]
    facts = await taskward.list_transitions(db, task_id)
    assert {f["lease_id"] for f in facts} == {"host:00000001/1"}


async def test_a_stale_known_worker_claims_nothing_an_unknown_one_may(db: StateDB) -> None:
    await submit(db)
    await taskward.register_heartbeat(db, worker_id="host:stale000", now=T0 - 91)
    assert await claim_runs(db, spec("host:stale000"), now=T0) == []
    await taskward.register_heartbeat(db, worker_id="host:fresh000", now=T0 - 90)
    assert len(await claim_runs(db, spec("host:fresh000"), now=T0)) == 1


async def test_claim_writes_lease_fields_and_covers_the_deadline(db: StateDB) -> None:
    short = await submit(db, "nap", {"seconds": 0, "timeout_s": 10})
    long = await submit(db, "nap", {"seconds": 0, "timeout_s": 1000}, now=T0 + 1)
    leases = {lease.task_id: lease for lease in await claim_runs(db, spec(), now=T0 + 5)}
    short_row, long_row = await taskward.get_task(db, short), await taskward.get_task(db, long)
    assert short_row["leased_by"] == "host:aaaaaaaa" and short_row["lease_attempts"] == 1
    assert short_row["deadline_at"] == T0 + 15
    assert short_row["lease_expires_at"] == T0 + 5 + 300  # lease_ttl dominates
    assert long_row["deadline_at"] == T0 + 1005
    assert long_row["lease_expires_at"] == T0 + 1005 + 30  # deadline + slack dominates
    assert leases[long].lease_id == "host:aaaaaaaa/1"


# What a row of each table is compared on across two stores: the table, the column naming its
# task, and the columns that differ by construction (new ids, and what is made of them).
_AUDIT_TABLES: Final = (
    ("schedule_runs", "id", frozenset({"id", "idempotency_key", "application_hash"})),
    ("status_transitions", "entity_id", frozenset({"id", "event_id", "request_hash"})),
    ("task_events", "task_id", frozenset({"id", "transition_id"})),
    ("dispatch_outbox", "schedule_run_id", frozenset({"id", "dedup_key", "transition_id"})),
)


async def _comparable_rows(
    db: StateDB, ids: list[str], tables: Sequence[tuple[str, str, frozenset[str]]]
) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """The rows of ``ids``' tasks in each table, as comparable values (each task as its place in
    ``ids``, also inside values such as a summary's session key; the skipped columns left out)
    and as read."""
    comparable: dict[str, list[Any]] = {}
    raw: dict[str, list[Any]] = {}
    for table, key, skip in tables:
        if db.dialect == "sqlite":
            marks = ", ".join("?" for _ in ids)
            sql = f"SELECT * FROM {table} WHERE {key} IN ({marks}) ORDER BY {key}"
            rows = db._connection().execute(sql, ids).fetchall()  # type: ignore[attr-defined]
        else:
            async with db.connection() as conn:  # type: ignore[attr-defined]
                cur = await conn.execute(
                    f"SELECT * FROM {table} WHERE {key} = ANY(%s) ORDER BY {key}", (ids,)
                )
                rows = await cur.fetchall()
        raw[table] = rows
        comparable[table] = sorted(
            (
                (key, ids.index(row[key])),
                *(
                    (name, _numbered(repr(value), ids))
                    for name, value in sorted(row.items())
                    if name not in skip and name != key
                ),
            )
            for row in rows
        )
    return comparable, raw


def _numbered(text: str, ids: list[str]) -> str:
    for place, task_id in enumerate(ids):
        text = text.replace(task_id, f"<task {place}>")
    return text


async def test_the_one_statement_claim_writes_what_the_paged_pass_writes(
    stores: Any, backend: str
) -> None:
    """A worker's claim template writes its claims without a request per row: PostgreSQL in
    one statement (run_claim_batch, its lease arithmetic and request hash in SQL), SQLite
    through the paged pass with each row's move built from the template
    (transitions.claim.claim_moves); without a template the paged pass builds each transition
    from its request. Two stores with the same applications, claimed at the same time one way
    each, must hold the same rows column by column: the runs (lease, deadline, projection),
    the facts (request hash recomputed from the request the paged pass would build) and the
    events. Timeouts cover the default, an explicit one and null (the default again;
    admission refuses zero)."""
    from taskward.transitions import claimed as claim_request
    from taskward.transitions import request_hash

    worker = spec("host:é-1")
    paged = spec("host:é-1")
    paged.__dict__["claim_template"] = None  # the cached property, answered: the paged pass
    assert worker.claim_template is not None

    async def claimed(use: WorkerSpec) -> tuple[list[str], dict[str, list[Any]]]:
        async with taskward.open_db(stores.new_url()) as db:
            ids = [
                await submit(db, "nap", {"seconds": 0, **timeout}, now=T0 + i)
                for i, timeout in enumerate(
                    [{}, {"timeout_s": 7.5}, {"timeout_s": None}, {}, {"timeout_s": 1000}]
                )
            ]
            leases = await claim_runs(db, use, now=T0 + 10)
            assert [lease.task_id for lease in leases] == ids
            for lease in leases:
                row = await taskward.get_task(db, lease.task_id)
                assert (lease.lease_expires_at, lease.deadline_at) == (
                    row["lease_expires_at"],
                    row["deadline_at"],
                )
            tables, raw = await _comparable_rows(db, ids, _AUDIT_TABLES[:3])
            for fact in raw["status_transitions"]:  # the hash of the paged pass's request
                attempt = int(fact["lease_id"].rpartition("/")[2])
                request = claim_request(worker.actor, worker.worker_id, fact["entity_id"], attempt)
                assert fact["request_hash"] == request_hash(request)
            return ids, tables

    _, one_statement = await claimed(worker)
    _, paged_rows = await claimed(paged)
    assert len(one_statement["status_transitions"]) == 5
    for table in one_statement:
        assert one_statement[table] == paged_rows[table], table


async def test_a_group_of_terminal_builds_writes_what_the_item_by_item_path_writes(
    stores: Any, backend: str
) -> None:
    """A group of terminal builds sharing one outcome is written from one finish_template:
    PostgreSQL in one statement (run_finish_batch: the request hash in SQL, one value where the
    group has one), SQLite as rows built from it (the hash spliced in Python); any other group
    goes item by item through apply_transitions. Two stores, the same claimed tasks finished at
    the same time one way each, must hold the same rows column by column: runs, facts (each
    request hash recomputed from the request the item path builds), events and notifications,
    and answer the same results. The group mixes evidence (none from the adapter, a return
    value with non-ASCII text), an exit code of 3, and one lease that is no longer the row's (a
    lost compare-and-swap: a conflict, nothing written)."""
    from taskward.execution import finish_build, outcome_for
    from taskward.transitions import TerminalBuild, apply_built, request_hash

    worker = spec("host:é-1")
    actor = Actor(type="system", id="host:é-1")
    results_by_path: dict[str, list[Any]] = {}

    async def finished(fast: bool) -> tuple[list[Any], dict[str, list[Any]]]:
        async with taskward.open_db(stores.new_url()) as db:
            ids = [await submit(db, "nap", {"seconds": 0}, now=T0 + i) for i in range(4)]
            leases = await claim_runs(db, worker, now=T0 + 10)
            evidence: list[list[dict[str, Any]]] = [
                [],
                [{"repr": "'\u00e9\u6f22 \"q\"'", "kind": "return_value"}],  # keys unsorted
                [],
                [],
            ]
            builds: list[Any] = []
            for n, lease in enumerate(leases):
                if n == 3:  # a lease the row no longer holds: its compare-and-swap is lost
                    lease = Lease(**{**lease.__dict__, "attempt": lease.attempt + 1})
                result = TaskExecutionResult(
                    status="completed", exit_code=3 if n == 2 else 0, evidence_refs=evidence[n]
                )

                def outcome(at: float, result: Any = result, lease: Lease = lease) -> Any:
                    return outcome_for(
                        result,
                        lease,
                        max_attempts=5,
                        cancel_requested=False,
                        now=at,
                        policy=RetryPolicy(),
                    )

                refs = [*evidence[n], {"kind": "summary", "session_key": f"{lease.task_id}:1"}]
                build = finish_build(
                    lease, outcome, actor=actor, evidence_refs=refs, key_suffix="ack"
                )
                assert type(build) is TerminalBuild
                builds.append(build if fast else (lambda at, b=build: b(at)))
            async with db.transaction(now=T0 + 20) as tx:
                results = await apply_built(tx, builds)
            results_by_path["fast" if fast else "items"] = results
            tables, raw = await _comparable_rows(db, ids, _AUDIT_TABLES)
            for fact in raw["status_transitions"]:
                if fact["previous_status"] == "running":  # not the claim's fact
                    request, _, _ = builds[ids.index(fact["entity_id"])](T0 + 20)
                    assert fact["request_hash"] == request_hash(request)
            for note in raw["dispatch_outbox"]:
                assert note["dedup_key"] == f"task-terminal:{note['transition_id']}"
            return ids, tables

    _, fast = await finished(True)
    _, items = await finished(False)
    assert len(fast["status_transitions"]) == 4 + 3  # 4 claims, 3 terminal facts
    assert len(fast["dispatch_outbox"]) == 3
    for table in fast:
        assert fast[table] == items[table], table
    shape = [
        (r.applied, r.conflict, r.previous_state, r.current_state, r.replayed)
        for r in results_by_path["fast"]
    ]
    assert shape == [
        (r.applied, r.conflict, r.previous_state, r.current_state, r.replayed)
        for r in results_by_path["items"]
    ]
    assert shape[3] == (False, True, "running", "running", False)  # lost: the row stays
    assert all(r.event_id for r in results_by_path["fast"][:3])


def _plant_fact(db_url: str, backend: str, entity_id: str, key: str) -> None:
    """A fact holding ``key`` for ``entity_id`` that the run's row does not show (as if another
    writer's transition under that key had been recorded): the next use of the key is taken."""
    row = (str(uuid.uuid4()), "schedule_run", entity_id, "running", "running", "x", "test", 1.0)
    sql = (
        "INSERT INTO status_transitions (id, entity_type, entity_id, previous_status, status, "
        "reason_code, source, created_at, idempotency_key) VALUES ({})"
    )
    if backend == "sqlite":
        import sqlite3

        with sqlite3.connect(db_url.split("?", 1)[0][len("sqlite:///") :]) as conn:
            conn.execute(sql.format(",".join("?" * 9)), (*row, key))
        return
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.format(",".join(["%s"] * 9)), (*row, key))


async def test_a_terminal_group_with_a_taken_transition_key_writes_nothing(
    db: StateDB, backend: str, db_url: str
) -> None:
    """One item of a terminal group whose transition key another fact holds: the whole group
    raises KeyAlreadyUsed and nothing of it stays (runs still running, no terminal fact, event
    or notification), so the group commit can run each item alone. On PostgreSQL the group's
    statement inserts its facts plainly and the unique index refuses the taken key."""
    from taskward.transitions import KeyAlreadyUsed, apply_built

    worker = spec()
    ids = [await submit(db, "nap", {"seconds": 0}, now=T0 + i) for i in range(3)]
    builds = _completions(await claim_runs(db, worker, now=T0 + 10), worker)
    taken, _, _ = builds[1](T0 + 20)
    _plant_fact(db_url, backend, ids[1], taken.idempotency_key)
    with pytest.raises(KeyAlreadyUsed):
        async with db.transaction(now=T0 + 20) as tx:
            await apply_built(tx, builds)
    await _still_running(db, ids)


def _completions(leases: Sequence[Lease], worker: WorkerSpec) -> list[Any]:
    """A ``completed`` terminal build for each lease, as the host's acknowledgement makes it."""
    from taskward.execution import finish_build, outcome_for
    from taskward.transitions import TerminalBuild

    builds = []
    for lease in leases:

        def outcome(at: float, lease: Lease = lease) -> Any:
            result = TaskExecutionResult(status="completed", exit_code=0)
            return outcome_for(
                result, lease, max_attempts=5, cancel_requested=False, now=at, policy=RetryPolicy()
            )

        build = finish_build(
            lease, outcome, actor=Actor(type="system", id=worker.worker_id), key_suffix="ack"
        )
        assert type(build) is TerminalBuild
        builds.append(build)
    return builds


async def _still_running(db: StateDB, ids: Sequence[str]) -> None:
    """Each task as its claim left it: running, no terminal fact, event or notification."""
    from taskward.outbox import list_notifications

    for task_id in ids:
        assert (await taskward.get_task(db, task_id))["status"] == "running"
        assert [f["status"] for f in await taskward.list_transitions(db, task_id)].count(
            "completed"
        ) == 0
        assert len(await taskward.list_task_events(db, task_id)) == 1  # the claim's
    assert (await list_notifications(db))[0] == []


async def test_statements_sent_together_abort_together_on_a_taken_key(
    db: StateDB, backend: str, db_url: str
) -> None:
    """``transitions.finish.together`` sends summaries, a terminal group and a claim pass in one
    round trip where the store runs them as statements (PostgreSQL; SQLite one after another,
    the pass paged after): what each sent alone would answer, and when the terminal group meets
    a taken transition key, KeyAlreadyUsed, with nothing of any of the three left: no summary,
    no completion, the queued tasks still queued."""
    from taskward.claims import claim_pass, pass_call, pass_claimed
    from taskward.host import LocalSummaryStore, SessionSummary
    from taskward.transitions import KeyAlreadyUsed
    from taskward.transitions.finish import together

    worker = spec()
    ids = [await submit(db, "nap", {"seconds": 0}, now=T0 + i) for i in range(4)]
    leases = await claim_runs(db, worker, limit=3, now=T0 + 10)
    running = [lease.task_id for lease in leases]
    summaries = LocalSummaryStore(db)
    rows = [
        summaries.params(
            f"{task_id}:1", SessionSummary(facts={"n": n}, narrative=None, manifest_ref="m")
        )
        for n, task_id in enumerate(running)
    ]

    async def send(builds: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        async with db.transaction(now=T0 + 20) as tx:
            call = pass_call(worker, 2, tx.now)
            assert call is not None
            written, results, [answer] = await together(
                tx,
                [("summary_insert_many", rows)],
                builds,
                [(call.template, call.params, call.limit)],
            )
            assert (answer is None) == (backend == "sqlite")
            if answer is None:
                leased = await claim_pass(tx, worker, 2)
            else:
                leased, _ = pass_claimed(worker, tx.now, call, answer)
            return written, results, leased

    taken, _, _ = _completions(leases, worker)[1](T0 + 20)
    _plant_fact(db_url, backend, running[1], taken.idempotency_key)
    with pytest.raises(KeyAlreadyUsed):
        await send(_completions(leases, worker))
    await _still_running(db, running)
    assert (await taskward.get_task(db, ids[3]))["status"] == "queued"
    assert await db.fetchone("summary_get", {"session_key": f"{running[0]}:1"}) is None

    # Without the taken key (another attempt's lease), the same three statements apply.
    worker2 = spec("host:bbbbbbbb")
    ids2 = [await submit(db, "nap", {"seconds": 0}, now=T0 + 5 + i) for i in range(3)]
    leases2 = await claim_runs(db, worker2, limit=2, now=T0 + 12)
    running, worker = [lease.task_id for lease in leases2], worker2
    rows = [
        summaries.params(f"{t}:1", SessionSummary(facts={}, narrative=None, manifest_ref="m"))
        for t in running
    ]
    written, results, leased = await send(_completions(leases2, worker2))
    assert written == [2] and [r.applied for r in results] == [True, True]
    assert running == [ids[3], ids2[0]]  # the oldest queued
    assert [c.lease.task_id for c in leased] == ids2[1:]
    for task_id in running:
        assert await statuses(db, task_id) == ["running", "completed"]


async def test_a_claim_pass_meeting_a_taken_transition_key_claims_nothing(
    db: StateDB, backend: str, db_url: str
) -> None:
    """A claim pass whose row's claim key another fact already holds raises KeyAlreadyUsed and
    leaves every row of the pass queued, with no claim fact or event: on PostgreSQL the
    one-statement pass inserts its facts plainly and the unique index refuses the key."""
    from taskward.claims import claim_pass
    from taskward.transitions import KeyAlreadyUsed, claimed

    worker = spec()
    ids = [await submit(db, now=T0 + i) for i in range(3)]
    key = claimed(worker.actor, worker.worker_id, ids[2], 1).idempotency_key
    _plant_fact(db_url, backend, ids[2], key)
    with pytest.raises(KeyAlreadyUsed):
        async with db.transaction(now=T0 + 10) as tx:
            await claim_pass(tx, worker, 3)
    for task_id in ids:
        row = await taskward.get_task(db, task_id)
        assert (row["status"], row["lease_attempts"], row["leased_by"]) == ("queued", 0, None)
        assert await taskward.list_task_events(db, task_id) == []


async def test_two_claimers_never_share_a_row(db: StateDB, db_url: str) -> None:
    ids = {await submit(db) for _ in range(30)}
    other = await taskward.open_db(db_url)
    try:
        a, b = await asyncio.gather(
            claim_runs(db, spec("host:aaaaaaaa"), now=T0),
            claim_runs(other, spec("host:bbbbbbbb"), now=T0),
        )
        a2, b2 = await asyncio.gather(
            claim_runs(db, spec("host:aaaaaaaa"), now=T0),
            claim_runs(other, spec("host:bbbbbbbb"), now=T0),
        )
    finally:
        await other.close()
    claimed = [lease.task_id for lease in a + b + a2 + b2]
    assert len(claimed) == len(set(claimed)) == 30
    assert set(claimed) == ids
    assert all(len(batch) <= 20 for batch in (a, b, a2, b2))


@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "group-commit"])
async def test_a_pass_whose_first_candidates_are_taken_scans_on_past_them(
    db: StateDB, backend: str, grouped: bool
) -> None:
    """Rows a concurrent claimer holds (FOR UPDATE SKIP LOCKED) do not end the pass empty while
    claimable rows remain behind them (the claim passes of one-slot hosts used to come back
    empty and idle)."""
    if backend != "postgres":
        pytest.skip("row locks held by another open transaction exist only on PostgreSQL")
    ids = [await submit(db, now=T0 + i) for i in range(40)]
    async with db.transaction() as holder:  # another claimer, mid-pass, holding the oldest 30
        held = await holder.fetchall("run_claim_page", _page_params(spec(), PAGE_AT, START, 30, 30))
        assert [r["id"] for r in held if r["locked"]] == ids[:30]
        # the pool serves this pass on other connections
        group = GroupCommit(db) if grouped else None
        claimed = await asyncio.wait_for(claim_rows(db, spec(), limit=2, group=group), 10)
    assert [c.lease.task_id for c in claimed] == ids[30:32]


async def test_a_claim_page_locks_the_first_free_rows_past_held_ones_in_page_order(
    db: StateDB, backend: str, db_url: str
) -> None:
    """The page's lock tries the first rows the pass asked for before looking past them
    (migration 0008); what it locks is still the first free served rows of the page, in page
    order, however the held rows fall between the two parts."""
    if backend != "postgres":
        pytest.skip("row locks held by another open transaction exist only on PostgreSQL")
    import psycopg

    ids = [await submit(db, now=T0 + i) for i in range(8)]
    cases = [
        ([ids[0], ids[2], ids[3]], 4, [ids[1], ids[4], ids[5], ids[6]]),  # short prefix
        ([ids[5]], 4, ids[:4]),  # the prefix alone suffices: held rows past it do not matter
        (ids[:4], 4, ids[4:8]),  # the whole prefix held
        (ids[1:7], 3, [ids[0], ids[7]]),  # fewer free rows than asked for
    ]
    for held, lock, expected in cases:
        async with await psycopg.AsyncConnection.connect(db_url) as other, other.transaction():
            await other.execute(
                "SELECT id FROM schedule_runs WHERE id = ANY(%s) FOR UPDATE", (held,)
            )
            async with db.transaction() as tx:
                page = await tx.fetchall(
                    "run_claim_page", _page_params(spec(), PAGE_AT, START, 10, lock)
                )
                assert [r["id"] for r in page] == ids
                assert [r["id"] for r in page if r["locked"]] == expected, (held, lock)


async def test_a_claim_page_locks_only_rows_its_worker_serves(db: StateDB, backend: str) -> None:
    """A host worker mid-pass does not hide the rows it cannot run from the worker that can: the
    page locks only served rows (target and capabilities, affinity never filtering), and only
    as many as the pass asked for."""
    if backend != "postgres":
        pytest.skip("row locks held by another open transaction exist only on PostgreSQL")
    elsewhere = await submit(db, target="daytona", now=T0)
    needs_gpu = await submit(db, required_capabilities=["gpu"], now=T0 + 1)
    warm = await submit(db, required_capabilities=["warmed-cache"], now=T0 + 2)
    plain = [await submit(db, now=T0 + 3 + i) for i in range(3)]
    async with db.transaction() as holder:  # a host worker, mid-pass, asking for two rows
        page = await holder.fetchall("run_claim_page", _page_params(spec(), PAGE_AT, START, 10, 2))
        assert [r["id"] for r in page] == [elsewhere, needs_gpu, warm, *plain]
        assert [r["id"] for r in page if r["locked"]] == [warm, plain[0]]
        gpu_worker = spec(
            "host:cccccccc", capabilities=["gpu"], execution_targets=["daytona", "host"]
        )
        claimed = await asyncio.wait_for(claim_runs(db, gpu_worker, now=T0 + 10), 10)
    assert [lease.task_id for lease in claimed] == [elsewhere, needs_gpu, *plain[1:]]


# -- routing --------------------------------------------------------------------------------


async def test_target_and_capability_filters_leave_unservable_rows_queued(db: StateDB) -> None:
    wrong_target = await submit(db, target="daytona")
    needs_gpu = await submit(db, required_capabilities=["gpu"])
    fine = await submit(db, required_capabilities=["warmed-cache"])  # affinity never filters
    leases = await claim_runs(db, spec(capabilities=["linux"]), now=T0)
    assert [lease.task_id for lease in leases] == [fine]
    assert await status(db, wrong_target) == await status(db, needs_gpu) == "queued"
    leases = await claim_runs(
        db, spec(capabilities=["gpu"], execution_targets=["daytona", "host"]), now=T0
    )
    assert {lease.task_id for lease in leases} == {wrong_target, needs_gpu}


async def test_only_kinds_the_registry_serves_are_claimed(db: StateDB) -> None:
    await submit(db, "agent", {"objective": "x"})
    noop = await submit(db)
    leases = await claim_runs(db, spec(kinds=["noop"]), now=T0)
    assert [lease.task_id for lease in leases] == [noop]


async def test_affinity_orders_with_stable_ties(db: StateDB) -> None:
    plain1 = await submit(db, now=T0)
    warm1 = await submit(db, required_capabilities=["warmed-cache"], now=T0 + 1)
    plain2 = await submit(db, now=T0 + 2)
    warm2 = await submit(db, required_capabilities=["warmed-cache"], now=T0 + 3)
    leases = await claim_runs(db, spec(capabilities=["warmed-cache"]), now=T0 + 10)
    assert [lease.task_id for lease in leases] == [warm1, warm2, plain1, plain2]
    await set_max_attempts(db, 3)


async def test_paging_reaches_eligible_rows_behind_an_ineligible_prefix(
    db: StateDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(60):
        await submit(db, target="daytona", now=T0 + i)
    eligible = [await submit(db, now=T0 + 100 + i) for i in range(3)]
    leases = await claim_runs(db, spec(), now=T0 + 200)
    assert [lease.task_id for lease in leases] == eligible
    # with a scan cap below the prefix, the pass stops before reaching them
    for task_id in eligible:
        await taskward.request_task_cancel(
            db, task_id, actor=Actor(type="operator", id="t"), idempotency_key="c"
        )
    late = await submit(db, now=T0 + 300)
    monkeypatch.setattr("taskward.claims.pages.CLAIM_SCAN_CAP", 50)
    assert await claim_runs(db, spec(), now=T0 + 400) == []
    monkeypatch.setattr("taskward.claims.pages.CLAIM_SCAN_CAP", 5000)
    assert [lease.task_id for lease in await claim_runs(db, spec(), now=T0 + 400)] == [late]


async def test_serialization_keys_block_running_rows_and_within_a_pass(db: StateDB) -> None:
    first = await submit(db, required_capabilities=["gpu-exclusive"], now=T0)
    second = await submit(db, required_capabilities=["gpu-exclusive"], now=T0 + 1)
    other = await submit(db, now=T0 + 2)
    gpu = spec(capabilities=["gpu-exclusive"])
    leases = await claim_runs(db, gpu, now=T0 + 5)
    assert {lease.task_id for lease in leases} == {first, other}
    assert (
        await claim_runs(db, spec("host:bbbbbbbb", capabilities=["gpu-exclusive"]), now=T0 + 6)
        == []
    )
    lease = next(lease for lease in leases if lease.task_id == first)
    await settle_lease(
        db,
        lease,
        TaskExecutionResult(status="completed"),
        actor=gpu.actor,
        max_attempts=3,
        policy=NO_JITTER,
        now=T0 + 7,
    )
    assert [lease.task_id for lease in await claim_runs(db, gpu, now=T0 + 8)] == [second]


# -- terminal writes and ownership (R4) -------------------------------------------------------


async def test_failure_records_exit_code_and_detail(db: StateDB) -> None:
    task_id = await submit(db, "boom", {"message": "kaput"})
    await taskward.claim_and_execute(db, worker_id="host:aaaaaaaa", registry=REGISTRY, now=T0)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "failed" and row["exit_code"] == 1
    assert "kaput" in row["error_detail"]
    assert row["status_reason_code"] == "execution_failed"


async def test_command_exit_code_reaches_the_row(db: StateDB) -> None:
    task_id = await submit(db, "command", {"argv": ["false"]})
    await taskward.claim_and_execute(db, worker_id="host:aaaaaaaa", registry=REGISTRY, now=T0)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["exit_code"]) == ("failed", 1)
    evidence = (await taskward.list_transitions(db, task_id))[-1]["evidence_refs"]
    assert evidence and evidence[0]["kind"] == "process"


async def test_terminal_write_after_nominal_expiry_applies_if_nothing_changed(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    [lease] = await claim_runs(db, spec(), now=T0)
    late = lease.lease_expires_at + 3600
    result = await settle_lease(
        db,
        lease,
        TaskExecutionResult(status="completed"),
        actor=spec().actor,
        max_attempts=3,
        policy=NO_JITTER,
        now=late,
    )
    assert result.applied and await status(db, task_id) == "completed"


async def test_a_reclaimed_rows_stale_owner_loses_and_its_result_is_only_evidence(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    [stale] = await claim_runs(db, spec("host:aaaaaaaa"), now=T0)
    counts = await taskward.reap_expired_leases(
        db, now=stale.lease_expires_at + 1, retry_policy=NO_JITTER
    )
    assert counts["retry_wait"] == 1
    await promote_due_retries(db, now=stale.lease_expires_at + 100)
    [fresh] = await claim_runs(db, spec("host:bbbbbbbb"), now=stale.lease_expires_at + 100)
    assert fresh.attempt == 2
    result = await settle_lease(
        db,
        stale,
        TaskExecutionResult(status="completed", exit_code=0),
        actor=spec().actor,
        max_attempts=3,
        policy=NO_JITTER,
    )
    assert result.conflict and result.current_state == "running"
    assert await statuses(db, task_id) == ["running", "retry_wait", "queued", "running"]
    events = await taskward.list_task_events(db, task_id)
    stale_events = [e for e in events if e["kind"] == "stale_result"]
    assert len(stale_events) == 1 and stale_events[0]["payload"]["lease_id"] == stale.lease_id
    row = await taskward.get_task(db, task_id)
    assert row["leased_by"] == "host:bbbbbbbb" and row["exit_code"] is None


# -- recovery (ADR-0072 D5) -------------------------------------------------------------------


async def test_expiry_is_strict_and_moves_through_retry_wait_with_backoff(db: StateDB) -> None:
    task_id = await submit(db)
    [lease] = await claim_runs(db, spec(), now=T0)
    assert (await taskward.reap_expired_leases(db, now=lease.lease_expires_at))["expired"] == 0
    counts = await taskward.reap_expired_leases(
        db, now=lease.lease_expires_at + 0.001, retry_policy=NO_JITTER
    )
    assert counts["retry_wait"] == 1
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "retry_wait" and row["leased_by"] is None
    assert row["lease_expires_at"] is None
    assert row["retry_at"] == pytest.approx(lease.lease_expires_at + 0.001 + 10.0)
    assert row["status_reason_code"] == "lease_expired"
    # not due yet, then due (retry_at <= now)
    assert (await promote_due_retries(db, now=row["retry_at"] - 0.001))["queued"] == 0
    assert (await promote_due_retries(db, now=row["retry_at"]))["queued"] == 1
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "queued" and row["queued_at"] == row["updated_at"]
    assert row["status_reason_code"] == "retry_ready"


async def test_a_tick_promotes_due_retries_oldest_first_and_cancels_a_requested_one_early(
    db: StateDB,
) -> None:
    """run_due_retries' two ranges (0009): rows due by retry_at, oldest first and at most
    ``limit`` a tick, and a row holding a cancellation request whatever its retry_at; rows not
    yet due stay where they are."""
    ids = [await submit(db, now=T0 + i) for i in range(4)]
    by_task = {lease.task_id: lease for lease in await claim_runs(db, spec(), now=T0 + 4)}
    assert set(by_task) == set(ids)
    leases = [by_task[t] for t in ids]
    # A cancellation request recorded while the last one runs, then a retryable failure.
    await taskward.request_task_cancel(
        db, ids[3], actor=Actor(type="operator", id="t"), idempotency_key="c", now=T0 + 5
    )
    for i, lease in enumerate(leases):  # retry_at = T0 + 10 + i + 10 (backoff of attempt 1)
        await settle_lease(
            db,
            lease,
            TaskExecutionResult(status="failed", retryable=True, error_detail="flaky"),
            actor=spec().actor,
            max_attempts=3,
            policy=NO_JITTER,
            now=T0 + 10 + i,
        )
    assert [await status(db, t) for t in ids] == ["retry_wait"] * 4
    # Nothing is due yet: only the row with the request leaves retry_wait, as cancelled.
    counts = await promote_due_retries(db, now=T0 + 15)
    assert counts == {"queued": 0, "cancelled": 1}
    assert [await status(db, t) for t in ids] == ["retry_wait"] * 3 + ["cancelled"]
    # Three due, one a tick: the oldest retry_at first.
    assert await promote_due_retries(db, now=T0 + 25, limit=1) == {"queued": 1, "cancelled": 0}
    assert [await status(db, t) for t in ids[:3]] == ["queued", "retry_wait", "retry_wait"]
    assert await promote_due_retries(db, now=T0 + 25) == {"queued": 2, "cancelled": 0}
    assert [await status(db, t) for t in ids] == ["queued"] * 3 + ["cancelled"]


async def test_due_retries_are_read_by_range_not_by_scanning_the_backlog(
    db: StateDB, db_url: str
) -> None:
    """A tick reads what is due through the partial indexes of 0009, whatever the size of
    the retry_wait backlog (it read and sorted every retry_wait row: 55 ms a tick on SQLite
    with 100,000 of them)."""
    from taskward.store.queries import load_queries

    sql = load_queries(db.dialect if db.dialect == "sqlite" else "postgres")["run_due_retries"]
    params = {"now": T0, "limit": 100}
    if db.dialect == "sqlite":
        import sqlite3

        path = db_url.split("?", 1)[0][len("sqlite:///") :]
        with sqlite3.connect(path) as conn:
            steps = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
        plan = " | ".join(steps)
        assert "SEARCH schedule_runs USING INDEX idx_schedule_runs_retry (retry_at<?)" in steps
        # The only table read without a range is the index of the rows holding a request.
        reads = [step for step in steps if "schedule_runs" in step]
        assert reads == [
            "SEARCH schedule_runs USING INDEX idx_schedule_runs_retry (retry_at<?)",
            "SCAN schedule_runs USING INDEX idx_schedule_runs_retry_cancel",
        ], plan
        return
    import psycopg

    positional = sql.replace(":now", "%(now)s").replace(":limit", "%(limit)s")
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # A backlog the planner knows about: 2,000 rows waiting an hour for their retry.
        await conn.execute(
            "INSERT INTO schedule_runs (id, trigger_context, action_kind, action_args, status, "
            "fired_at, created_at, queued_at, retry_at, lease_attempts) "
            "SELECT 'backlog-' || n, '{}', 'noop', '{}', 'retry_wait', %(t)s, %(t)s, %(t)s, "
            "%(t)s + 3600, 1 FROM generate_series(1, 2000) AS n",
            {"t": T0},
        )
        await conn.execute("ANALYZE schedule_runs")
        cursor = await conn.execute("EXPLAIN " + positional, params)
        plan = " | ".join(r[0] for r in await cursor.fetchall())
    assert "idx_schedule_runs_retry on schedule_runs" in plan, plan
    assert "idx_schedule_runs_retry_cancel" in plan, plan
    assert "Seq Scan" not in plan, plan


async def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    assert [NO_JITTER.delay(a) for a in (1, 2, 3, 4, 5)] == [10, 20, 40, 80, 100]
    jittery = RetryPolicy(base_s=10, jitter=0.2)
    assert jittery.delay(1, rng=lambda: 0.0) == 8.0 and jittery.delay(1, rng=lambda: 1.0) == 12.0


async def test_attempts_exhausted_by_expiry_fail_at_the_stored_ceiling(db: StateDB) -> None:
    await set_max_attempts(db, 2)
    task_id = await submit(db)
    now = T0
    for _ in range(2):
        await promote_due_retries(db, now=now)
        [lease] = await claim_runs(db, spec(), now=now)
        now = lease.lease_expires_at + 1
        await taskward.reap_expired_leases(db, now=now, retry_policy=NO_JITTER)
        now += 1000
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "failed" and row["lease_attempts"] == 2
    assert row["status_reason_code"] == "attempts_exhausted"
    assert await statuses(db, task_id) == ["running", "retry_wait", "queued", "running", "failed"]


async def test_rows_at_the_ceiling_are_never_claimed(db: StateDB) -> None:
    """R6, R18: a claim compares a row's attempts with the ceiling stored on the row. A row
    queued at it is never claimed, whatever the queue's ceiling says. (Such a row: a retry
    judged by a larger ceiling than its own, then promoted alone, which skips nothing.)"""
    task_id = await submit(db, max_attempts=1)
    [lease] = await claim_runs(db, spec(), now=T0)
    failed = TaskExecutionResult(status="failed", retryable=True, error_detail="again")
    settled = await settle_lease(
        db, lease, failed, actor=spec().actor, max_attempts=3, policy=NO_JITTER, now=T0 + 1
    )
    assert settled.applied
    await promote_due_retries(db, now=T0 + 10_000)
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["lease_attempts"], row["max_attempts"]) == ("queued", 1, 1)
    await set_max_attempts(db, 5)  # the queue's ceiling reaches no stored row
    assert await claim_runs(db, spec(), now=T0 + 10_001) == []
    assert await status(db, task_id) == "queued"


async def test_two_reapers_racing_write_one_fact(db: StateDB, db_url: str) -> None:
    task_ids = [await submit(db) for _ in range(10)]
    leases = await claim_runs(db, spec(), now=T0)
    late = max(lease.lease_expires_at for lease in leases) + 1
    other = await taskward.open_db(db_url)
    try:
        a, b = await asyncio.gather(
            taskward.reap_expired_leases(db, now=late, retry_policy=NO_JITTER),
            taskward.reap_expired_leases(other, now=late, retry_policy=NO_JITTER),
        )
    finally:
        await other.close()
    assert a["retry_wait"] + b["retry_wait"] == 10
    for task_id in task_ids:
        assert await statuses(db, task_id) == ["running", "retry_wait"]


async def test_reaper_and_terminal_write_race_has_one_winner(db: StateDB, db_url: str) -> None:
    other = await taskward.open_db(db_url)
    try:
        for _ in range(8):
            task_id = await submit(db)
            [lease] = await claim_runs(db, spec(), now=T0)
            late = lease.lease_expires_at + 1
            finish = settle_lease(
                db,
                lease,
                TaskExecutionResult(status="completed"),
                actor=spec().actor,
                max_attempts=3,
                policy=NO_JITTER,
                now=late,
            )
            reap = taskward.reap_expired_leases(other, now=late, retry_policy=NO_JITTER)
            await asyncio.gather(finish, reap)
            history = await statuses(db, task_id)
            assert history in (["running", "completed"], ["running", "retry_wait"])
    finally:
        await other.close()


async def test_retryable_failure_retries_then_stops_at_the_ceiling(db: StateDB) -> None:
    task_id = await submit(db, "flaky")
    now = T0
    for _ in range(3):
        await promote_due_retries(db, now=now)
        await taskward.claim_and_execute(
            db, worker_id="host:aaaaaaaa", registry=REGISTRY, now=now, retry_policy=NO_JITTER
        )
        now += 1000
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "failed" and row["status_reason_code"] == "attempt_ceiling"
    fact = (await taskward.list_transitions(db, task_id))[-1]
    assert fact["metadata"]["attempt_ceiling"] == 3
    assert await statuses(db, task_id) == ["running", "retry_wait", "queued"] * 2 + [
        "running",
        "failed",
    ]


async def test_plain_failure_fails_at_once(db: StateDB) -> None:
    task_id = await submit(db, "boom")
    await taskward.claim_and_execute(db, worker_id="host:aaaaaaaa", registry=REGISTRY, now=T0)
    assert await statuses(db, task_id) == ["running", "failed"]


# -- deadlines (R5) ---------------------------------------------------------------------------


async def test_owner_watchdog_reports_a_deadline_as_retryable(db: StateDB) -> None:
    task_id = await submit(db, "nap", {"seconds": 30, "timeout_s": 0.2})
    await taskward.claim_and_execute(
        db, worker_id="host:aaaaaaaa", registry=REGISTRY, retry_policy=NO_JITTER
    )
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "retry_wait" and row["status_reason_code"] == "deadline_exceeded"


async def test_deadline_at_the_ceiling_is_a_terminal_timed_out(db: StateDB) -> None:
    await set_max_attempts(db, 1)
    task_id = await submit(db, "nap", {"seconds": 30, "timeout_s": 0.2})
    await taskward.claim_and_execute(db, worker_id="host:aaaaaaaa", registry=REGISTRY)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "timed_out" and row["status_reason_code"] == "attempt_ceiling"


async def test_deadline_reaper_times_out_only_a_heartbeating_owner(db: StateDB) -> None:
    alive = await submit(db, "nap", {"seconds": 1, "timeout_s": 100})
    dead = await submit(db, "nap", {"seconds": 1, "timeout_s": 100}, now=T0 + 1)
    await taskward.register_heartbeat(db, worker_id="host:alive000", now=T0)
    await taskward.register_heartbeat(db, worker_id="host:dead0000", now=T0)
    [a] = await claim_runs(db, spec("host:alive000", kinds=["nap"]), limit=1, now=T0 + 2)
    [d] = await claim_runs(db, spec("host:dead0000", kinds=["nap"]), limit=1, now=T0 + 2)
    assert {a.task_id, d.task_id} == {alive, dead}
    past = a.deadline_at + 30  # deadline + grace
    await taskward.register_heartbeat(db, worker_id="host:alive000", now=past - 1)
    assert (await reap_deadlines(db, now=past - 0.01))["timed_out"] == 0
    counts = await reap_deadlines(db, now=past)
    assert counts["timed_out"] == 1
    assert await status(db, a.task_id) == "timed_out"
    assert await status(db, d.task_id) == "running"  # left to lease expiry
    late = await settle_lease(
        db,
        a,
        TaskExecutionResult(status="completed"),
        actor=spec().actor,
        max_attempts=3,
        policy=NO_JITTER,
    )
    assert late.conflict  # adapter cleanup cannot overwrite the timeout


# -- cancellation (ADR-0072 D5) ---------------------------------------------------------------


async def test_queued_cancel_is_never_claimed(db: StateDB) -> None:
    task_id = await submit(db)
    await taskward.request_task_cancel(
        db, task_id, actor=Actor(type="operator", id="t"), idempotency_key="c"
    )
    assert await claim_runs(db, spec(), now=T0) == []


async def test_running_cancel_reaches_the_adapter_and_is_acknowledged(
    db: StateDB, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    task_id = await submit(db, "until_cancelled", {"marker": str(marker)})
    run = asyncio.create_task(
        taskward.claim_and_execute(db, worker_id="host:aaaaaaaa", registry=REGISTRY)
    )
    for _ in range(500):
        if marker.exists():
            break
        await asyncio.sleep(0.01)
    result = await taskward.request_task_cancel(
        db, task_id, actor=Actor(type="operator", id="t"), idempotency_key="c"
    )
    assert result.state == "cancellation_requested"
    await asyncio.wait_for(run, 10)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "cancelled" and row["status_reason_code"] == "cancel_acknowledged"


async def test_completion_racing_cancellation_first_terminal_wins(db: StateDB) -> None:
    task_id = await submit(db)
    [lease] = await claim_runs(db, spec(), now=T0)
    await taskward.request_task_cancel(
        db, task_id, actor=Actor(type="operator", id="t"), idempotency_key="c", now=T0 + 1
    )
    done = await settle_lease(
        db,
        lease,
        TaskExecutionResult(status="completed"),
        actor=spec().actor,
        max_attempts=3,
        policy=NO_JITTER,
        now=T0 + 2,
    )
    assert done.applied and await status(db, task_id) == "completed"
    later = await taskward.request_task_cancel(
        db, task_id, actor=Actor(type="operator", id="t"), idempotency_key="c2"
    )
    assert later.state == "already_terminal"


async def test_a_cancelled_result_without_a_request_is_a_failure(db: StateDB) -> None:
    task_id = await submit(db)
    [lease] = await claim_runs(db, spec(), now=T0)
    await settle_lease(
        db,
        lease,
        TaskExecutionResult(status="cancelled"),
        actor=spec().actor,
        max_attempts=3,
        policy=NO_JITTER,
        now=T0 + 1,
    )
    assert await status(db, task_id) == "failed"


async def test_reaped_task_with_pending_cancel_goes_to_cancelled_not_back_to_work(
    db: StateDB,
) -> None:
    task_id = await submit(db)
    [lease] = await claim_runs(db, spec(), now=T0)
    await taskward.request_task_cancel(
        db, task_id, actor=Actor(type="operator", id="t"), idempotency_key="c", now=T0 + 1
    )
    await taskward.reap_expired_leases(db, now=lease.lease_expires_at + 1, retry_policy=NO_JITTER)
    assert await statuses(db, task_id) == ["running", "retry_wait", "cancelled"]


# -- adapters after the claim ------------------------------------------------------------------


async def test_adapter_lookup_after_claim_fails_typed_when_the_kind_vanished(db: StateDB) -> None:
    task_id = await submit(db)
    [lease] = await claim_runs(db, spec(), now=T0)
    row = await taskward.get_task(db, task_id)
    result = await execute_lease(
        TaskAdapterRegistry(), row, lease, cancellation=CancellationToken()
    )
    assert result.status == "failed" and "no adapter registered" in (result.error_detail or "")


class _Probe:
    """An adapter that records the task it ran in, then raises or sleeps as told."""

    action_kind = "command"

    def __init__(self, *, raises: bool = False, sleep_s: float = 0.0) -> None:
        self.raises, self.sleep_s = raises, sleep_s
        self.ran_in: asyncio.Task[object] | None = None

    def validate_args(self, args: dict[str, object]) -> None:
        return None

    async def execute(
        self, task: dict[str, object], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        self.ran_in = asyncio.current_task()
        await asyncio.sleep(self.sleep_s)
        if self.raises:
            raise RuntimeError("the adapter broke")
        return TaskExecutionResult(status="completed", exit_code=0)


@pytest.mark.parametrize("watchdog", [True, False])
async def test_without_its_watchdog_execute_lease_runs_the_adapter_in_the_callers_task(
    db: StateDB, watchdog: bool
) -> None:
    """The host bounds a run itself (ADR-0037 D5) and asks for no watchdog: the adapter then
    runs in the caller's task, past the lease's own deadline, and a raise is still a failure."""
    await submit(db)
    [lease] = await claim_runs(db, spec(), now=T0)
    row = await taskward.get_task(db, lease.task_id)
    registry = TaskAdapterRegistry()
    probe = _Probe()
    registry.register(probe)
    short = Lease(
        lease.task_id,
        lease.leased_by,
        lease.attempt,
        lease.lease_expires_at,
        lease.claimed_at + 0.05,
        lease.claimed_at,
        "command",
    )
    probe.sleep_s = 0.2
    result = await execute_lease(
        registry, row, short, cancellation=CancellationToken(), watchdog=watchdog
    )
    assert (probe.ran_in is asyncio.current_task()) is not watchdog
    assert result.status == ("timed_out" if watchdog else "completed")
    broken = TaskAdapterRegistry()
    broken.register(_Probe(raises=True))
    result = await execute_lease(
        broken, row, short, cancellation=CancellationToken(), watchdog=watchdog
    )
    assert result.status == "failed" and "the adapter broke" in (result.error_detail or "")


async def test_legacy_execute_function_is_honoured(db: StateDB) -> None:
    ok = await submit(db, now=T0)
    bad = await submit(db, now=T0 + 1)
    seen: list[str] = []

    async def execute(task: dict) -> tuple[int, str]:
        seen.append(task["id"])
        return (0, "") if task["id"] == ok else (3, "nope")

    assert (
        await taskward.claim_and_execute(
            db, worker_id="host:aaaaaaaa", execute=execute, registry=REGISTRY, now=T0 + 5
        )
        == 2
    )
    assert seen == [ok, bad]
    assert (await taskward.get_task(db, bad))["exit_code"] == 3
    assert await status(db, ok) == "completed"


async def test_lease_guard_is_the_lease_id_owner_and_attempt() -> None:
    """R4, R25: the guard names the lease (owner and attempt), not its expiry, which a renewal
    moves."""
    lease = Lease("t", "host:a", 2, 10.0, 5.0, 1.0, "noop")
    assert lease.guard() == {"leased_by": "host:a", "lease_attempts": 2}
    assert lease.lease_id == "host:a/2"


# -- placement reasons (computed on read) ------------------------------------------------------


async def test_placement_reason_says_why_a_task_stays_queued(db: StateDB) -> None:
    from taskward.placement import placement_reason

    task_id = await submit(db, required_capabilities=["gpu"], target="daytona")
    reason = await placement_reason(db, task_id, now=T0)
    assert not reason["claimable"] and "no live worker" in reason["reason"]
    await taskward.register_heartbeat(db, worker_id="host:aaaaaaaa", now=T0, served_kinds=["agent"])
    reason = await placement_reason(db, task_id, now=T0)
    assert "action_kind 'noop'" in reason["reason"]
    await taskward.register_heartbeat(db, worker_id="host:aaaaaaaa", now=T0, served_kinds=["noop"])
    reason = await placement_reason(db, task_id, now=T0)
    assert "execution_target 'daytona'" in reason["reason"]
    await taskward.register_heartbeat(
        db, worker_id="host:aaaaaaaa", now=T0, served_kinds=["noop"], execution_targets=["daytona"]
    )
    reason = await placement_reason(db, task_id, now=T0)
    assert "capabilities gpu" in reason["reason"]
    await taskward.register_heartbeat(
        db,
        worker_id="host:aaaaaaaa",
        now=T0,
        served_kinds=["noop"],
        execution_targets=["daytona"],
        advertised_capabilities=["gpu"],
    )
    reason = await placement_reason(db, task_id, now=T0)
    assert reason["claimable"] and reason["workers"] == ["host:aaaaaaaa"]
    # the heartbeat goes stale: nobody serves it any more
    reason = await placement_reason(db, task_id, now=T0 + 91)
    assert not reason["claimable"]


async def test_placement_reason_names_a_held_serialization_key(db: StateDB) -> None:
    from taskward.placement import placement_reason

    first = await submit(db, required_capabilities=["gpu-exclusive"], now=T0)
    second = await submit(db, required_capabilities=["gpu-exclusive"], now=T0 + 1)
    await taskward.register_heartbeat(
        db,
        worker_id="host:aaaaaaaa",
        now=T0,
        served_kinds=["noop"],
        advertised_capabilities=["gpu-exclusive"],
    )
    await claim_runs(db, spec(capabilities=["gpu-exclusive"]), limit=1, now=T0)
    assert await status(db, first) == "running"
    reason = await placement_reason(db, second, now=T0)
    assert "serialization key" in reason["reason"]
    assert (await placement_reason(db, first, now=T0))["reason"] == "task is running, not queued"
