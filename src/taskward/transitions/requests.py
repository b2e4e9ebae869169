"""What a transition is before it is written: its request, checked and hashed.

Named constructors build the requests of the edges the system itself takes (``claimed``,
``cancelled``, ``TerminalBuild`` for the way out of ``running``); recovery's edges are built in
``recovery``. Every request, however built, passes ``check_static`` before any write, and its
fact records ``request_hash`` of its content (ADR-0072 D3, DESIGN.md R3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from taskward.canonical import content_hash, json_string, plain_canonical_json, text_hash
from taskward.errors import InvalidTransition
from taskward.lifecycle import ENTITY_TYPES, check_edge, check_reason_code
from taskward.models import Actor, StateReason, TransitionRequest
from taskward.store.port import RUN_GUARD_COLUMNS, RUN_PATCH_COLUMNS

Built = tuple[TransitionRequest, Mapping[str, Any], Mapping[str, Any]]
"""A request with its guard and patch: what ``transition_at``'s build answers at a time."""

Prepared = tuple[TransitionRequest, Mapping[str, Any], Mapping[str, Any], str]
"""A statically checked transition ready to apply: ``(request, guard, patch, digest)``."""


def check_static(
    request: TransitionRequest, guard: Mapping[str, Any], patch: Mapping[str, Any]
) -> None:
    """R3 step 1, before any I/O: entity type, reason code (closed list), guard and patch
    columns (allowlists), declared edge (R2)."""
    if request.entity_type not in ENTITY_TYPES:
        raise InvalidTransition("entity_type", request.entity_type, sorted(ENTITY_TYPES))
    check_reason_code(request.reason.code)
    for column in guard:
        if column not in RUN_GUARD_COLUMNS:
            raise InvalidTransition("guard", column, sorted(RUN_GUARD_COLUMNS))
    for column in patch:
        if column not in RUN_PATCH_COLUMNS:
            raise InvalidTransition("patch", column, sorted(RUN_PATCH_COLUMNS))
    check_edge(request.from_state, request.to_state)


def prepared(
    request: TransitionRequest, guard: Mapping[str, Any], patch: Mapping[str, Any]
) -> Prepared:
    """``request`` checked (``check_static``, raising before any I/O) and hashed."""
    check_static(request, guard, patch)
    return request, guard, patch, request_hash(request)


def request_hash(request: TransitionRequest) -> str:
    """Hash of the request's content (guard and patch excluded: they carry times and leases
    that a retrying caller may recompute).

    The canonical JSON of ``request.model_dump(mode="json")`` is spliced here field by field
    (``request_text``), as the hot path hashes every claim and every acknowledgement; a reason
    whose evidence or metadata holds anything but plain JSON goes through the model, as does a
    subclass with fields of its own. A unit test holds the two equal.
    """
    text = request_text(request)
    if text is None:
        return content_hash(request.model_dump(mode="json"))
    return text_hash(text)


def request_text(request: TransitionRequest) -> str | None:
    """The canonical JSON of ``request`` spliced from its fields (keys in sorted order); None
    when only the model can say (see ``request_hash``). The templates cut this text around
    markers, so a row's hash is this function's, spliced (``templates``)."""
    reason = request.reason
    evidence = plain_canonical_json(reason.evidence_refs)
    metadata = plain_canonical_json(reason.metadata) if evidence is not None else None
    actor = request.actor
    if (
        metadata is None
        or type(request) is not TransitionRequest
        or type(reason) is not StateReason
        or type(actor) is not Actor
    ):
        return None
    return (
        f'{{"actor":{{"id":{json_string(actor.id)},"type":{json_string(actor.type)}}},'
        f'"entity_id":{json_string(request.entity_id)},'
        f'"entity_type":{json_string(request.entity_type)},'
        f'"from_state":{json_string(request.from_state)},'
        f'"idempotency_key":{json_string(request.idempotency_key)},'
        f'"reason":{{"code":{json_string(reason.code)},"evidence_refs":{evidence},'
        f'"metadata":{metadata},"summary":{json_string(reason.summary)}}},'
        f'"to_state":{json_string(request.to_state)}}}'
    )


# What the templates (``claim``, ``finish``) build a request with where a row's value goes, to
# cut its canonical text around them; a request whose own text holds one is not cut.
ENTITY_MARK: Final = "@entity@"
ATTEMPT_MARK: Final = "@attempt@"
EVIDENCE_MARK: Final = "@evidence@"


def lease_id(leased_by: str | None, lease_attempts: int | None) -> str | None:
    """A lease id is ``<leased_by>/<lease_attempts>`` (R4)."""
    if leased_by is None:
        return None
    return f"{leased_by}/{lease_attempts or 0}"


# -- named constructors ----------------------------------------------------------------------


def claimed(actor: Actor, worker_id: str, entity_id: str, attempt: int | str) -> TransitionRequest:
    """``queued -> running``: ``worker_id``'s claim of a run at ``attempt`` (ADR-0071 D4). The
    claim templates build it once with markers for the id and attempt (``templates``)."""
    return TransitionRequest(
        entity_id=entity_id,
        from_state="queued",
        to_state="running",
        reason=StateReason(code="claimed", summary=f"attempt {attempt}"),
        actor=actor,
        idempotency_key=f"claim:{worker_id}:{attempt}",
    )


def cancelled(
    entity_id: str, from_state: str, *, actor: Actor, key: str, summary: str, now: float
) -> Built:
    """``queued | waiting_dependency | retry_wait -> cancelled``: an operator's cancellation of
    a run no worker owns (ADR-0072 D5), ended now."""
    request = TransitionRequest(
        entity_id=entity_id,
        from_state=from_state,
        to_state="cancelled",
        reason=StateReason(code="cancelled", summary=summary),
        actor=actor,
        idempotency_key=key,
    )
    return request, {}, {"ended_at": now, "retry_at": None}


class Resolved(Protocol):
    """What a terminal build's outcome resolves to (``execution.Outcome``)."""

    @property
    def to_state(self) -> str: ...
    @property
    def reason_code(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def patch(self) -> dict[str, Any]: ...
    @property
    def metadata(self) -> dict[str, Any]: ...


class TerminalBuild:
    """The ``finished`` request: a guarded transition out of ``running`` under a lease, built at
    the operation's time (``execution.finish_build``). A build like any other (called with the
    time, it answers ``Built``); ``apply_built`` also reads its parts, so that a group of them
    is written from one template without a request model, a static check and a canonical text
    per item (``templates.finish_moves``)."""

    __slots__ = ("actor", "entity_id", "evidence_refs", "guard", "key", "outcome", "result")

    def __init__(
        self,
        *,
        entity_id: str,
        guard: dict[str, Any],
        lease_id: str,
        outcome: Resolved | Callable[[float], Resolved],
        actor: Actor,
        evidence_refs: list[dict[str, Any]],
        key_suffix: str,
        result: str | None = None,
    ) -> None:
        self.entity_id = entity_id
        self.guard = guard
        self.key = f"{key_suffix}:{lease_id}"
        self.outcome = outcome
        self.actor = actor
        self.evidence_refs = evidence_refs
        # R22: the return value's JSON text, written with the transition when it completes
        # (``rows.Move.result``); not part of the request, so not of its hash.
        self.result = result

    def resolve(self, at: float) -> Resolved:
        """The outcome at ``at`` (an outcome given as a function of the time is called once)."""
        outcome = self.outcome
        return outcome(at) if callable(outcome) else outcome

    def built(self, resolved: Resolved) -> Built:
        request = TransitionRequest(
            entity_id=self.entity_id,
            from_state="running",
            to_state=resolved.to_state,
            reason=StateReason(
                code=resolved.reason_code,
                summary=resolved.summary,
                evidence_refs=self.evidence_refs,
                metadata=resolved.metadata,
            ),
            actor=self.actor,
            idempotency_key=self.key,
        )
        return request, self.guard, resolved.patch

    def __call__(self, at: float) -> Built:
        return self.built(self.resolve(at))


def result_of(build: object, to_state: str) -> str | None:
    """The result a build stores with its transition (R22): a ``TerminalBuild``'s, when it
    moves to ``completed``; nothing otherwise."""
    if to_state != "completed" or type(build) is not TerminalBuild:
        return None
    return build.result


finished = TerminalBuild
"""The named constructor of the way out of ``running`` (``execution.finish_build`` builds it
with the lease's guard and id): ``running -> <outcome's state>`` keyed
``<key_suffix>:<lease_id>`` (ADR-0072 D4)."""
