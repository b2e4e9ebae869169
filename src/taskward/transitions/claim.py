"""The claim edge, ``queued -> running``, written for many rows from one template.

A worker's claims differ only in the row's id and attempt, so its claim request
(``requests.claimed``) is built once with markers and cut around them (``claim_template``):
``claim_moves`` then splices each row's values into the very text ``request_hash`` would hash,
without a request model per row. Where the store runs a claim pass as one statement
(PostgreSQL's ``run_claim_batch``: the first page, locked, and its claims),
``claim_first_page`` sends it; elsewhere it answers None and ``claims`` pages. The statement
writes the rows ``claim_moves`` would (tests/integration/test_worker.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from taskward.canonical import dumps, json_string, text_hash
from taskward.ids import new_id
from taskward.models import TransitionRequest
from taskward.store.port import KeyAlreadyUsed, Row, Tx
from taskward.transitions.requests import (
    ATTEMPT_MARK,
    ENTITY_MARK,
    check_static,
    request_text,
)
from taskward.transitions.rows import Move, event_payload, templated

ClaimItem = tuple[str, int, Mapping[str, Any], Mapping[str, Any]]
"""One claim of a pass: ``(entity_id, attempt, guard, patch)``."""


def claim_template(request_for: Callable[[str, str], TransitionRequest]) -> dict[str, Any] | None:
    """A worker's claim transition without a request per row: ``request_for(entity_id,
    attempt)`` (the claim's request) is built once with markers, and its fact's fields and its
    canonical request text are cut around them. None when the request cannot be cut that way (a
    reason the model must encode, a marker met twice, not the ``queued -> running`` edge): the
    caller then builds a request per row."""
    request = request_for(ENTITY_MARK, ATTEMPT_MARK)
    if (request.from_state, request.to_state) != ("queued", "running"):
        return None
    check_static(request, {}, {})
    text = request_text(request)
    if text is None:
        return None
    head, found, rest = text.partition(json_string(ENTITY_MARK))
    hashed = rest.split(ATTEMPT_MARK)
    key = request.idempotency_key.split(ATTEMPT_MARK)
    summary = request.reason.summary.split(ATTEMPT_MARK)
    if (
        not found
        or len(hashed) != 3
        or len(key) != 2
        or len(summary) != 2
        or ENTITY_MARK in head + rest + request.idempotency_key + request.reason.summary
    ):
        return None
    actor = request.actor.label()
    return {
        "entity_type": request.entity_type,
        "from_state": request.from_state,
        "to_state": request.to_state,
        "reason_code": request.reason.code,
        "summary_head": summary[0],
        "summary_tail": summary[1],
        "evidence_refs": dumps(request.reason.evidence_refs),
        "metadata": dumps(request.reason.metadata),
        "source": request.actor.type,
        "actor": actor,
        "key_head": key[0],
        "key_tail": key[1],
        "hash_0": head,
        "hash_1": hashed[0],
        "hash_2": hashed[1],
        "hash_3": hashed[2],
        "payload": event_payload(request.from_state, request.to_state, request.reason.code, actor),
    }


def claim_moves(template: Mapping[str, Any], items: Sequence[ClaimItem], now: float) -> list[Move]:
    """The moves of claims ``(entity_id, attempt, guard, patch)`` from ``template``, each what
    ``rows.move_of`` builds for the claim's request (a test compares them)."""
    head, tail = template["summary_head"], template["summary_tail"]
    key_head, key_tail = template["key_head"], template["key_tail"]
    hash_0, hash_1, hash_2, hash_3 = (template[f"hash_{n}"] for n in range(4))
    evidence = template["evidence_refs"]
    moves = []
    for entity_id, attempt, guard, patch in items:
        text = f"{hash_0}{json_string(entity_id)}{hash_1}{attempt}{hash_2}{attempt}{hash_3}"
        moves.append(
            templated(
                template,
                entity_id=entity_id,
                summary=f"{head}{attempt}{tail}",
                evidence_refs=evidence,
                guard=guard,
                patch=patch,
                key=f"{key_head}{attempt}{key_tail}",
                digest=text_hash(text),
                now=now,
            )
        )
    return moves


class ClaimedRows(NamedTuple):
    """``claim_first_page``'s answer: the rows it claimed (each as ``RETURNING *`` left it), in
    claim order, and what the page said: its size, whether a locked row with a serialization key
    stopped the pass, whether the worker's heartbeat was stale (then nothing was claimed)."""

    rows: list[Row]
    page_rows: int
    keyed: bool
    stale: bool


# The template's fields run_claim_batch takes (the event payload it builds itself, as jsonb).
_STATEMENT_FIELDS: Final = (
    "entity_type",
    "from_state",
    "to_state",
    "reason_code",
    "summary_head",
    "summary_tail",
    "evidence_refs",
    "metadata",
    "source",
    "actor",
    "key_head",
    "key_tail",
    "hash_0",
    "hash_1",
    "hash_2",
    "hash_3",
)


def claim_call(
    template: Mapping[str, Any], params: Mapping[str, Any], *, limit: int
) -> dict[str, Any]:
    """``run_claim_batch``'s parameters for one claim pass of up to ``limit``: the page and lease
    parameters are the caller's (``claims``), the transition's are ``template``'s, with new fact
    and event ids."""
    ids = [new_id() for _ in range(2 * limit)]
    return {
        **params,
        **{name: template[name] for name in _STATEMENT_FIELDS},
        "limit": limit,
        "fact_ids": ids[:limit],
        "event_ids": ids[limit:],
    }


def claimed_rows(template: Mapping[str, Any], found: list[Row]) -> ClaimedRows:
    """What ``run_claim_batch`` answered, as ``ClaimedRows`` (rows in claim order); a taken
    transition key raises KeyAlreadyUsed."""
    page_rows, keyed, stale = found[0]["page_rows"], found[0]["keyed"], found[0]["stale"]
    claimed: list[tuple[int, Row]] = []
    for row in found:
        for column in ("page_rows", "keyed", "stale"):
            del row[column]
        written = row.pop("fact_written")
        place = row.pop("claim_k")
        if row["id"] is None:  # the page's answer alone: nothing claimed
            continue
        if not written:
            attempt = row["lease_attempts"]
            raise KeyAlreadyUsed(f"{template['key_head']}{attempt}{template['key_tail']}")
        claimed.append((place, row))
    claimed.sort(key=lambda pair: pair[0])
    return ClaimedRows([row for _, row in claimed], int(page_rows), bool(keyed), bool(stale))


async def claim_first_page(
    tx: Tx, template: Mapping[str, Any], params: Mapping[str, Any], *, limit: int
) -> ClaimedRows | None:
    """A claim pass's first page and its claims in one statement, where the store runs it
    (``Tx.auditing``: PostgreSQL); None where it does not, and the caller pages."""
    auditing = tx.auditing()
    if auditing is None:
        return None
    found = await auditing.claim_queued(claim_call(template, params, limit=limit))
    return claimed_rows(template, found)
