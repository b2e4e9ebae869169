"""transition_task (ADR-0072 D3, R2, R3) on both backends."""

from __future__ import annotations

import pytest

import taskward
from taskward import transition_task
from taskward.errors import InvalidTransition, TaskNotFound, TransitionIdempotencyConflict
from taskward.store.port import StateDB

from .helpers import move, request, submit

# A path from a fresh queued row to each state, through declared edges only.
PATH_TO = {
    "queued": ["queued"],
    "waiting_dependency": ["queued", "waiting_dependency"],
    "running": ["queued", "running"],
    "retry_wait": ["queued", "running", "retry_wait"],
}
R2_EDGES = [(src, dst) for src, outs in taskward.EDGES.items() for dst in outs]


@pytest.mark.parametrize("src,dst", sorted(R2_EDGES))
async def test_every_declared_edge_applies_with_one_fact_and_one_event(
    db: StateDB, src: str, dst: str
) -> None:
    task_id = await submit(db)
    await move(db, task_id, *PATH_TO[src])
    before = len(await taskward.list_transitions(db, task_id))
    result = await transition_task(db, request(task_id, src, dst, summary="why"), now=5000.0)
    assert result.applied and not result.conflict
    assert (result.previous_state, result.current_state) == (src, dst)
    row = await taskward.get_task(db, task_id)
    assert row["status"] == dst
    assert row["updated_at"] == 5000.0
    assert row["status_reason_code"] == "operator"
    assert row["status_reason_summary"] == "why"
    facts = await taskward.list_transitions(db, task_id)
    assert len(facts) == before + 1
    fact = facts[-1]
    assert (fact["id"], fact["previous_status"], fact["status"]) == (result.transition_id, src, dst)
    assert fact["actor"] == "system:test" and fact["created_at"] == 5000.0
    events = await taskward.list_task_events(db, task_id)
    assert [e["id"] for e in events][-1] == result.event_id
    assert events[-1]["transition_id"] == result.transition_id
    assert len(events) == len(facts)


@pytest.mark.parametrize("terminal", sorted(s.value for s in taskward.TERMINAL))
async def test_terminal_states_have_no_exits(db: StateDB, terminal: str) -> None:
    for dst in taskward.Status:
        with pytest.raises(InvalidTransition):
            await transition_task(db, request("any-id", terminal, dst.value))


async def test_undeclared_edge_raises_before_any_write(db: StateDB) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "running")
    with pytest.raises(InvalidTransition) as info:
        await transition_task(db, request(task_id, "running", "queued"))
    assert isinstance(info.value, ValueError)
    assert (await taskward.get_task(db, task_id))["status"] == "running"
    assert len(await taskward.list_transitions(db, task_id)) == 1


async def test_static_checks_raise_even_for_a_missing_task(db: StateDB) -> None:
    # R3: static checks come before the missing-row check.
    with pytest.raises(InvalidTransition):
        await transition_task(db, request("missing", "queued", "completed"))
    with pytest.raises(InvalidTransition) as info:
        await transition_task(db, request("missing", "queued", "running", code="nope"))
    assert info.value.field == "reason.code"
    with pytest.raises(InvalidTransition) as info:
        await transition_task(db, request("missing", "queued", "running"), guard={"status": "x"})
    assert info.value.field == "guard"
    with pytest.raises(InvalidTransition) as info:
        await transition_task(
            db, request("missing", "queued", "running"), patch={"action_args": "{}"}
        )
    assert info.value.field == "patch"
    bad_entity = request("missing", "queued", "running").model_copy(
        update={"entity_type": "dispatch"}
    )
    with pytest.raises(InvalidTransition) as info:
        await transition_task(db, bad_entity)
    assert info.value.field == "entity_type"


async def test_missing_task_raises_task_not_found(db: StateDB) -> None:
    with pytest.raises(TaskNotFound) as info:
        await transition_task(db, request("no-such-task", "queued", "running", code="claimed"))
    assert isinstance(info.value, LookupError)


async def test_wrong_from_state_is_a_conflict_that_writes_nothing(db: StateDB) -> None:
    task_id = await submit(db)
    result = await transition_task(db, request(task_id, "running", "completed"))
    assert result.conflict and not result.applied
    assert result.current_state == "queued"
    assert result.event_id is None
    assert await taskward.list_transitions(db, task_id) == []
    assert await taskward.list_task_events(db, task_id) == []


async def test_guard_mismatch_is_a_conflict_and_none_means_is_null(db: StateDB) -> None:
    task_id = await submit(db)
    claim = request(task_id, "queued", "running", code="claimed")
    lost = await transition_task(db, claim, guard={"leased_by": "someone"})
    assert lost.conflict and lost.current_state == "queued"
    won = await transition_task(
        db,
        claim,
        guard={"leased_by": None, "lease_attempts": 0},
        patch={"leased_by": "w1", "lease_attempts": 1, "lease_expires_at": 99.0},
    )
    assert won.applied
    row = await taskward.get_task(db, task_id)
    assert (row["leased_by"], row["lease_attempts"], row["lease_expires_at"]) == ("w1", 1, 99.0)
    stale = await transition_task(
        db,
        request(task_id, "running", "completed", code="completed"),
        guard={"leased_by": "w0", "lease_expires_at": 99.0},
    )
    assert stale.conflict and stale.current_state == "running"
    facts = await taskward.list_transitions(db, task_id)
    assert len(facts) == 1 and facts[0]["lease_id"] == "w1/1"


async def test_a_conflict_does_not_consume_the_key(db: StateDB) -> None:
    task_id = await submit(db)
    claim = request(task_id, "queued", "running", code="claimed", key="claim-1")
    assert (await transition_task(db, claim, guard={"leased_by": "x"})).conflict
    assert (await transition_task(db, claim, guard={"leased_by": None})).applied


async def test_replayed_key_returns_the_original_result_without_writing(db: StateDB) -> None:
    task_id = await submit(db)
    claim = request(task_id, "queued", "running", code="claimed", key="claim-1")
    first = await transition_task(db, claim)
    # The task moves on and even comes back to queued; the replay must not claim it again.
    await move(db, task_id, "running", "retry_wait", "queued")
    replay = await transition_task(db, claim)
    assert replay.applied and replay.replayed
    assert (replay.transition_id, replay.event_id) == (first.transition_id, first.event_id)
    assert (replay.previous_state, replay.current_state) == ("queued", "running")
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert len(await taskward.list_transitions(db, task_id)) == 3


async def test_reusing_a_key_with_different_content_raises(db: StateDB) -> None:
    task_id = await submit(db)
    await transition_task(db, request(task_id, "queued", "running", code="claimed", key="k"))
    with pytest.raises(TransitionIdempotencyConflict) as info:
        await transition_task(
            db, request(task_id, "queued", "cancelled", code="cancelled", key="k")
        )
    assert info.value.key == "k"


async def test_transition_keys_are_scoped_to_the_task(db: StateDB) -> None:
    a, b = await submit(db), await submit(db)
    assert (await transition_task(db, request(a, "queued", "skipped", key="same"))).applied
    assert (await transition_task(db, request(b, "queued", "skipped", key="same"))).applied


async def test_patch_writes_lifecycle_columns(db: StateDB) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "running")
    result = await transition_task(
        db,
        request(task_id, "running", "failed", code="execution_failed"),
        patch={
            "ended_at": 7.0,
            "exit_code": 3,
            "error_detail": "boom",
            "invocation_id": "inv-1",
            "deadline_at": 9.0,
        },
    )
    assert result.applied
    row = await taskward.get_task(db, task_id)
    assert (
        row["ended_at"],
        row["exit_code"],
        row["error_detail"],
        row["invocation_id"],
        row["deadline_at"],
    ) == (7.0, 3, "boom", "inv-1", 9.0)


async def test_evidence_refs_are_projected_on_the_row_and_the_fact(db: StateDB) -> None:
    task_id = await submit(db)
    req = request(task_id, "queued", "skipped").model_copy(
        update={"reason": taskward.StateReason(code="skipped", evidence_refs=[{"kind": "log"}])}
    )
    await transition_task(db, req)
    assert (await taskward.get_task(db, task_id))["status_evidence_refs"] == [{"kind": "log"}]
    assert (await taskward.list_transitions(db, task_id))[0]["evidence_refs"] == [{"kind": "log"}]
