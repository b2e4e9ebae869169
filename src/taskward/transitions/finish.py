"""The way out of ``running``, written for a group from one template; and ``apply_built``, the
group commit's combine for every kind of build.

Tasks finishing at the same moment under one worker's leases mostly share one outcome (state,
reason, summary, metadata) and differ in the row's id, attempt and evidence; ``finish_template``
cuts that outcome's request text around markers so ``finish_moves`` splices each row's values
into the text ``request_hash`` would hash. Where the store runs the group as one statement
(PostgreSQL's ``run_finish_batch``), ``apply_finishes`` sends it; elsewhere the moves go through
``apply``. ``together`` sends a step's writes, finishes and claim passes in one round trip where
the store can (the resident host's one-step finish).

R22: a completion's stored result is a per-row value like its evidence (``TerminalBuild.result``,
never part of the request or its hash): ``run_finish_batch`` inserts it for the rows whose
compare-and-swap applied, and ``apply`` writes it with the facts of the moves that applied;
every path here passes it on (``result_of``), so none adds a statement or a round trip for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Final, NamedTuple

from taskward.canonical import dumps, json_string, loads, plain_canonical_json, text_hash
from taskward.ids import new_id
from taskward.lifecycle import is_terminal
from taskward.models import Actor, StateReason, TransitionRequest, TransitionResult
from taskward.store.port import KeyAlreadyUsed, Params, Row, Tx
from taskward.transitions.apply import (
    applied_move,
    apply,
    lost,
    settle_dependents,
    wake_queued,
)
from taskward.transitions.claim import ClaimedRows, claim_call, claimed_rows
from taskward.transitions.requests import (
    ATTEMPT_MARK,
    ENTITY_MARK,
    EVIDENCE_MARK,
    Built,
    Resolved,
    TerminalBuild,
    check_static,
    prepared,
    request_hash,
    request_text,
    result_of,
)
from taskward.transitions.rows import (
    OUTBOX_MAX_ATTEMPTS,
    OUTBOX_TTL_S,
    Move,
    event_payload,
    move_of,
    templated,
)

# The patch of every terminal outcome (execution.outcome_for), in its order; run_finish_batch
# sets ended_at to the transaction's time and error_detail and invocation_id to NULL, so only
# outcomes holding exactly that take a template.
FINISH_PATCH: Final = ("ended_at", "exit_code", "error_detail", "invocation_id")


@lru_cache(maxsize=64)
def finish_template(
    actor: Actor, key_head: str, to_state: str, reason_code: str, summary: str, metadata: str
) -> dict[str, Any] | None:
    """A group's ``running -> to_state`` transition without a request per row: the request
    (``metadata`` as its canonical JSON, the key ``key_head`` then the attempt) is built once
    with markers for the row's id, attempt and evidence, checked as each request would be
    (raising as it would), and its canonical text cut around the markers. None when it cannot
    be cut that way."""
    request = TransitionRequest(
        entity_id=ENTITY_MARK,
        from_state="running",
        to_state=to_state,
        reason=StateReason(
            code=reason_code,
            summary=summary,
            evidence_refs=[{"kind": EVIDENCE_MARK}],
            metadata=loads(metadata),
        ),
        actor=actor,
        idempotency_key=key_head + ATTEMPT_MARK,
    )
    guard = {"leased_by": "", "lease_attempts": 0}
    check_static(request, guard, dict.fromkeys(FINISH_PATCH))
    text = request_text(request)
    evidence = plain_canonical_json(request.reason.evidence_refs)
    if text is None or evidence is None:
        return None
    head, entity, rest = text.partition(json_string(ENTITY_MARK))
    middle, attempt, rest = rest.partition(ATTEMPT_MARK)
    between, refs, tail = rest.partition(evidence)
    pieces = (head, middle, between, tail, key_head, summary, metadata)
    marks = (ENTITY_MARK, ATTEMPT_MARK, EVIDENCE_MARK)
    if not (entity and attempt and refs) or any(m in p for p in pieces for m in marks):
        return None
    return {
        "entity_type": request.entity_type,
        "from_state": "running",
        "to_state": to_state,
        "reason_code": reason_code,
        "summary": summary,
        "metadata": dumps(request.reason.metadata),
        "source": actor.type,
        "actor": actor.label(),
        "key_head": key_head,
        "key_tail": "",
        "hash_0": head,
        "hash_1": middle,
        "hash_2": between,
        "hash_3": tail,
        "payload": event_payload("running", to_state, reason_code, actor.label()),
    }


def _finish_params(
    terminals: Sequence[TerminalBuild], resolved: Sequence[Resolved], now: float
) -> tuple[dict[str, Any], str] | None:
    """The group's per-row values, and its key head; None unless every item moves out of
    ``running`` to one outcome (state, reason, summary, metadata) under a lease of one owner,
    with the terminal patch at ``now`` and no error detail or invocation id, plain JSON
    evidence, and a run of its own."""
    first_terminal, first = terminals[0], resolved[0]
    metadata = plain_canonical_json(first.metadata)
    leased_by = first_terminal.guard.get("leased_by")
    if metadata is None or not isinstance(leased_by, str):
        return None
    suffix = first_terminal.key.partition(":")[0]
    key_head = f"{suffix}:{leased_by}/"
    outcome = (first.to_state, first.reason_code, first.summary)
    ids: list[str] = []
    attempts: list[int] = []
    exit_codes: list[int | None] = []
    evidence: list[str] = []
    results: list[str | None] = []  # R22: what each completion stores (None: nothing)
    for terminal, item in zip(terminals, resolved, strict=True):
        guard, patch = terminal.guard, item.patch
        attempt = guard.get("lease_attempts")
        exit_code = patch.get("exit_code")
        refs = plain_canonical_json(terminal.evidence_refs)
        if (
            (item.to_state, item.reason_code, item.summary) != outcome
            or item.metadata != first.metadata
            or terminal.actor != first_terminal.actor
            or tuple(guard) != ("leased_by", "lease_attempts")  # claims.Lease.guard (R4, R25)
            or guard["leased_by"] != leased_by
            or type(attempt) is not int
            or terminal.key != f"{key_head}{attempt}"
            or tuple(patch) != FINISH_PATCH
            or patch["ended_at"] != now
            or patch["error_detail"] is not None
            or patch["invocation_id"] is not None
            or (exit_code is not None and type(exit_code) is not int)
            or refs is None
        ):
            return None
        ids.append(terminal.entity_id)
        attempts.append(attempt)
        exit_codes.append(exit_code)
        evidence.append(refs)
        results.append(result_of(terminal, item.to_state))
    if len(set(ids)) != len(ids):
        return None
    params = {
        "metadata_json": metadata,
        "now": now,
        "worker_id": leased_by,
        "ids": ids,
        "attempts": attempts,
        "exit_codes": exit_codes,
        "evidence": evidence,
        "results": results,
    }
    return params, key_head


def finish_group(
    terminals: Sequence[TerminalBuild], resolved: Sequence[Resolved], now: float
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The group's per-row values and its ``finish_template``, or None when the group does not
    fit (``_finish_params``, ``finish_template``)."""
    found = _finish_params(terminals, resolved, now)
    if found is None:
        return None
    params, key_head = found
    first = resolved[0]
    template = finish_template(
        terminals[0].actor,
        key_head,
        first.to_state,
        first.reason_code,
        first.summary,
        params.pop("metadata_json"),
    )
    return None if template is None else (params, template)


def finish_moves(
    terminals: Sequence[TerminalBuild],
    resolved: Sequence[Resolved],
    params: Mapping[str, Any],
    template: Mapping[str, Any],
    now: float,
) -> list[Move]:
    """The moves of a group that fits ``finish_group``, each what ``rows.move_of`` builds for
    the item's request (a test compares them)."""
    hash_0, hash_1, hash_2, hash_3 = (template[f"hash_{n}"] for n in range(4))
    moves = []
    for terminal, item, canonical, attempt, result in zip(
        terminals,
        resolved,
        params["evidence"],
        params["attempts"],
        params["results"],
        strict=True,
    ):
        entity = json_string(terminal.entity_id)
        move = templated(
            template,
            entity_id=terminal.entity_id,
            summary=template["summary"],
            evidence_refs=dumps(terminal.evidence_refs),
            guard=terminal.guard,
            patch=item.patch,
            key=terminal.key,
            digest=text_hash(f"{hash_0}{entity}{hash_1}{attempt}{hash_2}{canonical}{hash_3}"),
            now=now,
        )
        move.result = result
        moves.append(move)
    return moves


class FinishCall(NamedTuple):
    """A group of terminal builds prepared as one ``run_finish_batch`` statement
    (``finish_call``): its parameters, and what ``finish_results`` reads its answer with."""

    params: dict[str, Any]
    terminals: Sequence[TerminalBuild]
    resolved: Sequence[Resolved]
    fact_ids: list[str]
    event_ids: list[str]


def finish_call(tx: Tx, builds: Sequence[Callable[[float], Built]]) -> FinishCall | None:
    """``apply_built``'s one-statement form for ``builds``, prepared but not sent. None unless
    the store runs it (``Tx.auditing``) and every build is a ``TerminalBuild`` of one
    ``finish_template``. Outcomes are resolved at ``tx``'s time, once."""
    if tx.auditing() is None or not builds:
        return None
    if not all(type(build) is TerminalBuild for build in builds):
        return None
    terminals: Sequence[TerminalBuild] = builds  # type: ignore[assignment]
    resolved = [terminal.resolve(tx.now) for terminal in terminals]
    found = finish_group(terminals, resolved, tx.now)
    return None if found is None else _finish_call(terminals, resolved, *found)


def _finish_call(
    terminals: Sequence[TerminalBuild],
    resolved: Sequence[Resolved],
    params: dict[str, Any],
    template: dict[str, Any],
) -> FinishCall:
    count = len(terminals)
    new = [new_id() for _ in range(3 * count)]
    fact_ids, event_ids = new[:count], new[count : 2 * count]
    outbox_ids = new[2 * count :] if is_terminal(resolved[0].to_state) else [None] * count
    call = {
        **{name: value for name, value in template.items() if name != "payload"},
        **params,
        "fact_ids": fact_ids,
        "event_ids": event_ids,
        "outbox_ids": outbox_ids,
        "outbox_max_attempts": OUTBOX_MAX_ATTEMPTS,
        "outbox_ttl_s": OUTBOX_TTL_S,
    }
    return FinishCall(call, terminals, resolved, fact_ids, event_ids)


async def finish_results(tx: Tx, call: FinishCall, rows: list[Row]) -> list[TransitionResult]:
    """What ``run_finish_batch`` answered for ``call``, one result per build in order: a row the
    compare-and-swap did not change gets ``lost``'s answer; a taken transition key raises
    KeyAlreadyUsed. Rows that have dependents get them settled here, in ``tx`` (R21)."""
    written = {row["id"]: row["fact_written"] for row in rows}
    first = call.resolved[0]
    results: list[TransitionResult] = []
    for terminal, item, fact_id, event_id in zip(
        call.terminals, call.resolved, call.fact_ids, call.event_ids, strict=True
    ):
        fact_written = written.get(terminal.entity_id)
        if fact_written is None:
            request, guard, patch = terminal.built(item)
            move = move_of(request, guard, patch, request_hash(request), tx.now)
            results.append(await lost(tx, move, fact_id))
            continue
        if not fact_written:
            raise KeyAlreadyUsed(terminal.key)
        results.append(applied_move("running", first.to_state, fact_id, event_id))
    if first.to_state == "queued" and any(result.applied for result in results):
        wake_queued(tx)
    ended = [row["id"] for row in rows if row.get("has_dependents")]
    if ended:  # R21: as ``apply`` does after a terminal write, in this same transaction
        await settle_dependents(tx, ended)
    return results


async def apply_finishes(
    tx: Tx, terminals: Sequence[TerminalBuild], resolved: Sequence[Resolved]
) -> list[TransitionResult] | None:
    """A group of terminal builds from one ``finish_template``, each with its own
    compare-and-swap, fact, event and notification: one ``run_finish_batch`` statement where
    the store runs it (PostgreSQL), else its moves through ``apply``. None when the group does
    not fit (``finish_group``): the caller then builds a request per item."""
    found = finish_group(terminals, resolved, tx.now)
    if found is None:
        return None
    params, template = found
    auditing = tx.auditing()
    if auditing is None:
        moves = finish_moves(terminals, resolved, params, template, tx.now)
        return [result for result, _ in await apply(tx, moves, one_shape=True)]
    call = _finish_call(terminals, resolved, params, template)
    return await finish_results(auditing, call, await auditing.finish_running(call.params))


async def apply_built(tx: Tx, builds: Sequence[Callable[[float], Built]]) -> list[TransitionResult]:
    """Build each transition at ``tx``'s time, check it statically, and apply them all
    set-based (GroupCommit's combine for ``transition_at``). A replayed idempotency key raises
    ``KeyAlreadyUsed``: the caller's transaction is then rolled back whole.

    A group of ``TerminalBuild`` items that share one outcome goes through ``apply_finishes``;
    anything else, and anything that declines, a request per item. Each outcome is resolved
    once either way."""
    now = tx.now
    if builds and all(type(build) is TerminalBuild for build in builds):
        terminals: Sequence[TerminalBuild] = builds  # type: ignore[assignment]
        resolved = [terminal.resolve(now) for terminal in terminals]
        finished = await apply_finishes(tx, terminals, resolved)
        if finished is not None:
            return finished
        built = [
            terminal.built(outcome) for terminal, outcome in zip(terminals, resolved, strict=True)
        ]
    else:
        built = [build(now) for build in builds]
    moves = []
    for build, (request, guard, patch) in zip(builds, built, strict=True):
        move = move_of(*prepared(request, guard, patch), now)
        move.result = result_of(build, request.to_state)  # R22: a completion's result
        moves.append(move)
    return [result for result, _ in await apply(tx, moves)]


ClaimPass = tuple[Mapping[str, Any], Mapping[str, Any], int]
"""A claim pass to send with a step: ``(template, params, limit)`` (``claim.claim_call``)."""


async def together(
    tx: Tx,
    writes: Sequence[tuple[str, Sequence[Params]]],
    builds: Sequence[Callable[[float], Built]],
    passes: Sequence[ClaimPass],
) -> tuple[list[int], list[TransitionResult], list[ClaimedRows | None]]:
    """``write_many(writes)``, then ``apply_built(builds)``, then each claim pass's first page
    and claims, in that order: in one round trip where the store runs all three as statements
    (PostgreSQL), else one after another with every pass answered None (the caller pages).
    Returns the writes' counts, the builds' results and the passes' answers."""
    finish = finish_call(tx, builds)
    auditing = tx.auditing()
    if auditing is None or finish is None:
        counts = await tx.write_many(writes)
        return counts, await apply_built(tx, builds), [None] * len(passes)
    counts, [rows], answers = await auditing.together(
        writes,
        [finish.params],
        [claim_call(template, params, limit=limit) for template, params, limit in passes],
    )
    results = await finish_results(tx, finish, rows)
    claimed: list[ClaimedRows | None] = [
        claimed_rows(template, found)
        for (template, _, _), found in zip(passes, answers, strict=True)
    ]
    return counts, results, claimed
