"""The invariant checker (issue 8): what must hold in a store once it is quiescent.

``check_invariants(db)`` reads the whole store through named, set-based queries (the
``check_*`` blocks of each dialect's ``queries.sql``) and returns every broken invariant as a
``Violation(code, task_id, detail)``; it writes nothing that survives (the append-only probe runs
in a transaction it rolls back). Tests, fault scenarios and benchmarks call it after quiescence:
faults off, and reapers run with ``now`` past every lease that should have lapsed.

The invariants and their codes (``CODES`` holds the same list):

- admission is effectively once (ADR-0072 D1/D2): one task per idempotency key, live or as an
  archived task's tombstone (R23; ``duplicate_idempotency_key``); every acknowledged admission
  present under the id the caller was told (``acknowledged_admission_missing``,
  ``acknowledged_admission_mismatch``); no fact outlives its run (``fact_without_run``, R11);
- nothing ``running`` without a live lease: an owner and ``lease_expires_at >= now``
  (``running_without_lease``);
- facts tell the whole story (ADR-0072 D3, R2): a row with no facts is ``queued``, otherwise its
  status is its last fact's target (``status_mismatch``); its facts, in insertion order, start
  from ``queued`` (``chain_start``), each leaves the previous one's target (``chain_broken``)
  along a declared edge (``undeclared_edge``); exactly one terminal fact on a terminal row and
  none on any other (``terminal_fact_count`` -- implied by the chain and status checks, so it
  always comes with one of them); a terminal row is not touched after its terminal fact
  (``terminal_row_changed``: ``updated_at`` differs from that fact's ``created_at``); exactly one
  ``transition`` event per fact, naming it (``fact_event_mismatch``); every fact has an actor
  (``fact_without_actor``) and a reason code from the closed list (``fact_without_reason``);
- leases (R4): the n-th claim of a task records lease ``<holder>/<n>`` and the row's
  ``lease_attempts`` is its number of claims (``attempt_mismatch``); every fact that leaves
  ``running`` -- every terminal fact written by a worker's acknowledgement or a reaper, and every
  requeue -- was written under the lease current when it committed (``lease_not_current``, see
  below);
- the attempt ceiling (R6, R18: each row's own ``max_attempts``): no row above it
  (``attempts_above_ceiling``) and no ``queued``/``retry_wait``/``waiting_dependency`` row at it,
  which no claim would ever select again (``stranded_at_ceiling``);
- summary before completion (ADR-0037 D4): a ``completed`` run has a complete summary for its
  final attempt, session key ``<task-id>:<attempt>``, created and last updated no later than its
  completed fact (``summary_missing``, ``summary_after_completion``);
- the outbox (ADR-0072 D6, R12), when the ``dispatch_outbox`` table exists: exactly one row per
  terminal fact, dedup key ``task-terminal:<transition-id>`` (``outbox_missing`` unless the caller
  says finished rows were purged, ``outbox_duplicate``), and none naming no terminal fact of its
  task (``outbox_orphan``);
- dependencies (R21): no waiting task the readiness rule would move (``dependency_unsettled``:
  a dependency's terminal transaction settles its dependents, the maintenance pass the rest),
  none without a dependency (``waiting_without_dependencies``), and no task claimed before each
  of its dependencies completed (``started_before_dependency``);
- ``status_transitions`` refuses UPDATE and DELETE (``facts_mutable``): both are attempted on a
  probe fact inside a transaction that is always rolled back.

**The lease current when a fact committed.** A lease is created only by a claim fact
(``queued -> running``), which records it as ``lease_id = <leased_by>/<lease_attempts>``, and
ends only with the next fact, which leaves ``running``. So for every fact F with
``previous_status = 'running'``, the lease current when F committed is the ``lease_id`` of the
fact just before F (its claim; ``chain_broken`` reports the case where that fact is not a
claim). F satisfies the invariant when (1) F's own ``lease_id`` -- the lease its compare-and-swap
guarded -- equals the claim's, and (2) the lease F's writer presented, which its transition key
names, is that same lease: ``finish:<lease-id>`` (worker functions) and ``ack:<lease-id>``
(``LocalTaskSource``) must name the claim's lease id; ``reap:<task>:<n>`` and
``deadline:<task>:<n>`` (reapers) must name the claim's attempt. Facts with other keys (an
operator's ``transition_task``) are held to (1) only. Facts that do not leave ``running`` --
cancelling an unowned ``queued``/``retry_wait`` row, promoting a retry -- are written under no
lease and are not part of this invariant.

Known limits: the ceiling checks read the ceiling stored now. The idle rows a lowered ceiling
strands are ended by the reapers (``queued -> skipped``, reason ``attempt_ceiling``), so none is
reported once they ran; but a row that ran more attempts than a ceiling lowered later is still
reported as ``attempts_above_ceiling``, though it was legal when written. "Unless purged" cannot
tell a purged outbox row from one never written, so the caller says whether finished rows were
purged. Summaries are required of every completed run (both the resident host and the ADR-0071
``claim_and_execute`` write one first); ``require_summaries=False`` is for stores written by an
older taskward, and completed facts that cite a summary are still held to it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from taskward.dependencies import broken_links
from taskward.lifecycle import EDGES, REASON_CODES, TERMINAL, Status
from taskward.store.port import StateDB

CODES: Final[Mapping[str, str]] = {
    "duplicate_idempotency_key": "more than one run holds one idempotency key",
    "acknowledged_admission_missing": "no run holds a key whose admission was acknowledged",
    "acknowledged_admission_mismatch": "a key's run is not the id the caller was told",
    "fact_without_run": "facts of a task whose run row is gone",
    "running_without_lease": "a running row without an owner or with an expired lease",
    "status_mismatch": "a row's status is not its last fact's target (queued if none)",
    "chain_start": "a task's first fact does not leave queued",
    "chain_broken": "a fact does not leave the previous fact's target",
    "undeclared_edge": "a fact follows an edge that is not declared",
    "terminal_fact_count": "a terminal row without exactly one terminal fact, or another row "
    "with one",
    "terminal_row_changed": "a terminal row was updated after its terminal fact",
    "fact_event_mismatch": "a fact without exactly one transition event naming it, or an "
    "event naming no fact",
    "fact_without_actor": "a fact without an actor",
    "fact_without_reason": "a fact without a reason code from the closed list",
    "attempt_mismatch": "a claim's lease is not '<holder>/<n>' for the n-th claim, or "
    "lease_attempts is not the number of claims",
    "lease_not_current": "a fact leaving running was not written under the current lease",
    "attempts_above_ceiling": "lease_attempts above the stored attempt ceiling",
    "stranded_at_ceiling": "an idle (queued, retry_wait, waiting) row at the ceiling",
    "summary_missing": "a completed run without a complete summary for its final attempt",
    "summary_after_completion": "a completed run's summary written or changed after completion",
    "outbox_missing": "a terminal fact without its outbox row",
    "outbox_duplicate": "a terminal fact with more than one outbox row",
    "outbox_orphan": "an outbox row naming no terminal fact of its task",
    "facts_mutable": "status_transitions accepted an UPDATE or a DELETE",
    "dependency_unsettled": "a waiting task the readiness rule would move (R21)",
    "waiting_without_dependencies": "a waiting_dependency task with no dependency",
    "started_before_dependency": "a task claimed before a dependency of its completed",
}

OUTBOX_TABLE: Final = "dispatch_outbox"
_PROBE_ENTITY_PREFIX: Final = "taskward-checker-probe:"
_IDLE: Final = sorted(
    s.value for s in (Status.QUEUED, Status.RETRY_WAIT, Status.WAITING_DEPENDENCY)
)


@dataclass(frozen=True, order=True)
class Violation:
    """One broken invariant: a code from ``CODES``, the task it concerns (None when it concerns
    the store as a whole) and what was found."""

    code: str
    task_id: str | None
    detail: str

    def __str__(self) -> str:
        where = f" task {self.task_id}" if self.task_id else ""
        return f"{self.code}{where}: {self.detail}"


class InvariantsViolated(AssertionError):
    """Raised by ``assert_invariants``; ``violations`` holds what the checker found."""

    def __init__(self, violations: list[Violation], *, limit: int = 25) -> None:
        self.violations = violations
        shown = "\n  ".join(str(v) for v in violations[:limit])
        more = f"\n  ... and {len(violations) - limit} more" if len(violations) > limit else ""
        super().__init__(f"{len(violations)} invariant violation(s):\n  {shown}{more}")


def _json(values: object) -> str:
    return json.dumps(values, separators=(",", ":"))


def _edges() -> list[str]:
    return sorted(f"{src.value}>{dst.value}" for src, targets in EDGES.items() for dst in targets)


def _terminal() -> list[str]:
    return sorted(s.value for s in TERMINAL)


async def check_invariants(
    db: StateDB,
    *,
    acknowledged: Mapping[str, str] | None = None,
    now: float | None = None,
    require_summaries: bool = True,
    outbox_purged: bool = False,
    events_pruned: bool = False,
    probe_append_only: bool = True,
) -> list[Violation]:
    """Every broken invariant of the store, sorted by code, task and detail (empty when sound).

    Args:
        acknowledged: idempotency key -> the task id its caller was told.
        now: the time leases are judged against (``lease_expires_at < now`` is expired, R6);
            None means the store's clock (R9). Pass the ``now`` the reapers last ran with when
            time is injected.
        require_summaries: hold every completed run to summary-before-complete; when False only
            completed facts that cite a summary in their evidence are.
        outbox_purged: finished outbox rows were purged, so a terminal fact without its row is
            not reported (duplicates and orphans still are).
        events_pruned: old events were pruned (R23, ``retention.prune``): a fact without its
            event is not reported (an event naming no fact or another task's still is).
        probe_append_only: attempt an UPDATE and a DELETE of a probe fact (rolled back).
    """
    if now is None:
        now = await db.now()
    outbox = await db.fetchone("check_table_exists", {"name": OUTBOX_TABLE})
    checks = [
        _check_admissions(db, acknowledged or {}),
        _check_leases(db, now),
        _check_runs_against_facts(db),
        _check_fact_chain(db),
        _check_fact_events(db, pruned=events_pruned),
        _check_fact_fields(db),
        _check_attempts(db),
        _check_summaries(db, require_all=require_summaries),
        _check_dependencies(db),
    ]
    if outbox is not None and outbox["present"]:
        checks.append(_check_outbox(db, purged=outbox_purged))
    # Independent reads: a pooled store runs them side by side, a single connection in turn.
    found = [v for batch in await asyncio.gather(*checks) for v in batch]
    if probe_append_only:
        found += await _probe_append_only(db)
    return sorted(found)


async def assert_invariants(db: StateDB, **options: Any) -> None:
    """``check_invariants`` for tests: raise ``InvariantsViolated`` listing what broke."""
    violations = await check_invariants(db, **options)
    if violations:
        raise InvariantsViolated(violations)


async def _check_admissions(db: StateDB, acknowledged: Mapping[str, str]) -> list[Violation]:
    found = [
        Violation(
            "duplicate_idempotency_key",
            row["task_id"],
            f"key {row['idempotency_key']!r} is held by {row['n']} runs",
        )
        for row in await db.fetchall("check_duplicate_keys")
    ]
    for row in await db.fetchall("check_facts_without_run"):
        found.append(
            Violation("fact_without_run", row["task_id"], f"{row['n']} fact(s), no run row")
        )
    if acknowledged:
        held: dict[str, set[str]] = {}
        rows = await db.fetchall("check_runs_by_keys", {"keys": _json(sorted(acknowledged))})
        for row in rows:
            held.setdefault(row["idempotency_key"], set()).add(row["id"])
        for key, told in sorted(acknowledged.items()):
            ids = held.get(key)
            if not ids:
                found.append(
                    Violation(
                        "acknowledged_admission_missing",
                        told,
                        f"key {key!r} was acknowledged as {told} but no run holds it",
                    )
                )
            elif told not in ids:
                found.append(
                    Violation(
                        "acknowledged_admission_mismatch",
                        told,
                        f"key {key!r} was acknowledged as {told} but is held by "
                        f"{', '.join(sorted(ids))}",
                    )
                )
    return found


async def _check_leases(db: StateDB, now: float) -> list[Violation]:
    return [
        Violation(
            "running_without_lease",
            row["id"],
            f"leased_by={row['leased_by']!r} lease_expires_at={row['lease_expires_at']!r} "
            f"now={now!r}",
        )
        for row in await db.fetchall("check_running_without_lease", {"now": now})
    ]


async def _check_runs_against_facts(db: StateDB) -> list[Violation]:
    found: list[Violation] = []
    for row in await db.fetchall("check_runs_against_facts", {"terminal": _json(_terminal())}):
        task_id = row["task_id"]
        if row["bad_status"]:
            last = row["last_status"] or "none (expected queued)"
            found.append(
                Violation("status_mismatch", task_id, f"status {row['status']}, last fact {last}")
            )
        if row["bad_terminal_count"]:
            found.append(
                Violation(
                    "terminal_fact_count",
                    task_id,
                    f"status {row['status']} with {row['terminals']} terminal fact(s)",
                )
            )
        if row["bad_terminal_changed"]:
            found.append(
                Violation(
                    "terminal_row_changed",
                    task_id,
                    f"updated_at {row['updated_at']!r} after terminal fact at {row['last_at']!r}",
                )
            )
        if row["bad_attempts"]:
            found.append(
                Violation(
                    "attempt_mismatch",
                    task_id,
                    f"lease_attempts {row['lease_attempts']} but {row['claims']} claim fact(s)",
                )
            )
    return found


async def _check_fact_chain(db: StateDB) -> list[Violation]:
    found: list[Violation] = []
    for row in await db.fetchall("check_fact_chain", {"edges": _json(_edges())}):
        task_id, fact = row["task_id"], f"fact #{row['n']} {row['transition_id']}"
        edge = f"{row['previous_status']} -> {row['status']}"
        if row["bad_start"]:
            found.append(Violation("chain_start", task_id, f"{fact} leaves {edge}, not queued"))
        if row["bad_chain"]:
            found.append(
                Violation(
                    "chain_broken",
                    task_id,
                    f"{fact} is {edge} but the previous fact ended in {row['prior_status']}",
                )
            )
        if row["bad_edge"]:
            found.append(Violation("undeclared_edge", task_id, f"{fact} is {edge}"))
        if row["bad_claim"]:
            found.append(
                Violation(
                    "attempt_mismatch",
                    task_id,
                    f"{fact} is claim {row['attempt']} with lease {row['lease_id']!r}",
                )
            )
        if row["bad_lease"]:
            found.append(
                Violation(
                    "lease_not_current",
                    task_id,
                    f"{fact} ({edge}, key {row['idempotency_key']!r}) recorded lease "
                    f"{row['lease_id']!r}; the current lease was {row['prior_lease_id']!r} "
                    f"(attempt {row['attempt']})",
                )
            )
    return found


async def _check_fact_events(db: StateDB, *, pruned: bool) -> list[Violation]:
    found: list[Violation] = []
    for row in await db.fetchall("check_fact_events"):
        if pruned and row["event_id"] is None and not row["mismatched"] and not row["n"]:
            continue  # its event was pruned (R23: ``taskward prune`` deletes old events)
        if row["event_id"] is not None:
            detail = f"transition event {row['event_id']} names no fact ({row['transition_id']})"
        elif row["mismatched"]:
            detail = f"fact {row['transition_id']}: its event names another task, status or id"
        else:
            detail = f"fact {row['transition_id']} has {row['n']} transition events"
        found.append(Violation("fact_event_mismatch", row["task_id"], detail))
    return found


async def _check_fact_fields(db: StateDB) -> list[Violation]:
    found: list[Violation] = []
    rows = await db.fetchall("check_fact_fields", {"reason_codes": _json(sorted(REASON_CODES))})
    for row in rows:
        fact = f"fact {row['transition_id']}"
        actor, code = row["actor"], row["reason_code"]
        if actor is None or not str(actor).strip():
            found.append(Violation("fact_without_actor", row["task_id"], f"{fact}: {actor!r}"))
        if code is None or str(code) not in REASON_CODES:
            found.append(
                Violation("fact_without_reason", row["task_id"], f"{fact}: reason {code!r}")
            )
    return found


async def _check_attempts(db: StateDB) -> list[Violation]:
    found: list[Violation] = []
    rows = await db.fetchall("check_attempts", {"idle": _json(_IDLE)})
    for row in rows:
        attempts, max_attempts = row["lease_attempts"], row["max_attempts"]
        if attempts > max_attempts:
            found.append(
                Violation(
                    "attempts_above_ceiling",
                    row["task_id"],
                    f"{attempts} attempts, ceiling {max_attempts}",
                )
            )
        else:
            found.append(
                Violation(
                    "stranded_at_ceiling",
                    row["task_id"],
                    f"{row['status']} with {attempts} attempts at ceiling {max_attempts}",
                )
            )
    return found


async def _check_dependencies(db: StateDB) -> list[Violation]:
    """R21's three invariants (``dependencies.broken_links``)."""
    return [Violation(*found) for found in await broken_links(db)]


def _cites_summary(evidence: object) -> bool:
    return isinstance(evidence, list) and any(
        isinstance(ref, dict) and ref.get("kind") == "summary" for ref in evidence
    )


async def _check_summaries(db: StateDB, *, require_all: bool) -> list[Violation]:
    found: list[Violation] = []
    for row in await db.fetchall("check_completed_summaries"):
        if not require_all and not _cites_summary(row["evidence_refs"]):
            continue
        key = f"{row['task_id']}:{row['attempt']}"
        if row["session_key"] is None or row["state"] != "complete":
            state = row["state"] or "absent"
            found.append(Violation("summary_missing", row["task_id"], f"summary {key} is {state}"))
        else:
            found.append(
                Violation(
                    "summary_after_completion",
                    row["task_id"],
                    f"summary {key} created {row['summary_created_at']!r}, updated "
                    f"{row['summary_updated_at']!r}; completed at {row['completed_at']!r}",
                )
            )
    return found


async def _check_outbox(db: StateDB, *, purged: bool) -> list[Violation]:
    found: list[Violation] = []
    for row in await db.fetchall("check_outbox", {"terminal": _json(_terminal())}):
        problem, transition = row["problem"], row["transition_id"]
        if problem == "missing":
            if not purged:
                found.append(
                    Violation(
                        "outbox_missing",
                        row["task_id"],
                        f"terminal fact {transition} has no row task-terminal:{transition}",
                    )
                )
        elif problem == "duplicate":
            found.append(
                Violation(
                    "outbox_duplicate",
                    row["task_id"],
                    f"terminal fact {transition} has {row['n']} outbox rows",
                )
            )
        else:
            found.append(
                Violation(
                    "outbox_orphan",
                    row["task_id"],
                    f"outbox row {row['outbox_id']} names {transition}, not a terminal fact of "
                    "its task",
                )
            )
    return found


class _RollBack(Exception):
    """Leave the probe transaction, rolling back whatever it wrote."""


async def _probe_append_only(db: StateDB) -> list[Violation]:
    """Try an UPDATE and a DELETE of a probe fact, each in a savepoint, then roll all back."""
    accepted: list[str] = []
    fact_id = str(uuid.uuid4())
    try:
        async with db.transaction() as tx:
            await tx.execute(
                "check_fact_probe_insert",
                {"id": fact_id, "entity_id": f"{_PROBE_ENTITY_PREFIX}{fact_id}"},
            )
            for statement in ("UPDATE", "DELETE"):
                name = f"check_fact_probe_{statement.lower()}"
                try:
                    async with tx.savepoint():
                        changed = await tx.execute(name, {"id": fact_id})
                except Exception:  # refused: a trigger (or a permission) raised, as it must
                    continue
                if changed:
                    accepted.append(statement)
            raise _RollBack
    except _RollBack:
        pass
    return [
        Violation("facts_mutable", None, f"status_transitions accepted {statement}")
        for statement in accepted
    ]


__all__ = [
    "CODES",
    "InvariantsViolated",
    "Violation",
    "assert_invariants",
    "check_invariants",
]
