"""Admission (ADR-0072 D1/D2, R8) on both backends: validation, canonical hash, idempotency."""

from __future__ import annotations

import dataclasses

import pytest

import taskward
from taskward import TaskApplication, submit_task
from taskward.adapters import AdapterConfig, build_registry
from taskward.admission import MAX_ARGS_BYTES, validate_application
from taskward.errors import AdapterNotRegistered, TaskIdempotencyConflict, TaskValidationError
from taskward.store.port import StateDB

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true", "echo"})))


def app(**changes: object) -> TaskApplication:
    base = TaskApplication(
        action_kind="command",
        args={"argv": ["true"]},
        execution_target="host",
        idempotency_key="key-1",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


async def count_runs(db: StateDB) -> int:
    rows, _ = await taskward.list_tasks(db, limit=500)
    return len(rows)


async def test_new_row_starts_exactly_as_adr_0071_d2_says(db: StateDB) -> None:
    task_id = await submit_task(
        db, app(required_capabilities=["b", "a", "b"]), registry=REGISTRY, now=1000.0
    )
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "queued"
    assert row["schedule_id"] is None and row["invocation_id"] is None
    assert row["leased_by"] is None and row["lease_expires_at"] is None
    assert row["trigger_context"] == {} and row["chain_depth"] == 0
    assert row["fired_at"] == row["created_at"] == row["queued_at"] == 1000.0
    assert row["lease_attempts"] == 0
    assert row["required_capabilities"] == ["a", "b"]
    assert row["idempotency_key"] == "key-1"
    assert row["application_hash"].startswith("sha256:")
    assert row["admission_source"] == "library"
    assert await taskward.list_transitions(db, task_id) == []
    assert await taskward.list_task_events(db, task_id) == []


async def test_same_key_same_application_returns_the_original_unchanged(db: StateDB) -> None:
    first = await submit_task(db, app(), registry=REGISTRY, now=1000.0)
    before = await taskward.get_task(db, first)
    again = await submit_task(db, app(), registry=REGISTRY, now=2000.0)
    assert again == first
    assert await taskward.get_task(db, first) == before
    assert await count_runs(db) == 1


async def test_capability_order_and_duplicates_do_not_change_the_hash(db: StateDB) -> None:
    first = await submit_task(db, app(required_capabilities=["x", "y"]), registry=REGISTRY)
    again = await submit_task(db, app(required_capabilities=["y", "x", "x"]), registry=REGISTRY)
    assert first == again


async def test_same_key_different_application_is_a_conflict_writing_nothing(db: StateDB) -> None:
    first = await submit_task(db, app(), registry=REGISTRY)
    before = await taskward.get_task(db, first)
    with pytest.raises(TaskIdempotencyConflict) as info:
        await submit_task(db, app(args={"argv": ["echo", "other"]}), registry=REGISTRY)
    assert info.value.key == "key-1"
    assert info.value.existing_task_id == first
    assert isinstance(info.value, ValueError)
    assert await taskward.get_task(db, first) == before
    assert await count_runs(db) == 1


async def test_key_stays_bound_after_the_task_is_terminal(db: StateDB) -> None:
    first = await submit_task(db, app(), registry=REGISTRY)
    await taskward.request_task_cancel(
        db, first, actor=taskward.Actor(type="operator", id="t"), idempotency_key="c"
    )
    assert (await taskward.get_task(db, first))["status"] == "cancelled"
    assert await submit_task(db, app(), registry=REGISTRY) == first
    with pytest.raises(TaskIdempotencyConflict):
        await submit_task(db, app(execution_target="process"), registry=REGISTRY)


async def test_playbook_is_stored_as_play_without_mutating_the_caller(db: StateDB) -> None:
    application = app(action_kind="playbook", args={}, idempotency_key="pb")
    task_id = await submit_task(db, application, registry=REGISTRY)
    assert application.action_kind == "playbook"
    assert (await taskward.get_task(db, task_id))["action_kind"] == "play"
    # the alias and the canonical name are the same application
    assert (
        await submit_task(
            db, app(action_kind="play", args={}, idempotency_key="pb"), registry=REGISTRY
        )
        == task_id
    )


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "   "}, "idempotency_key"),
        ({"idempotency_key": None}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"execution_target": "mars"}, "execution_target"),
        ({"args": ["not", "a", "dict"]}, "args"),
        ({"args": {"argv": ["true"], "x": float("nan")}}, "args"),
        ({"args": {"argv": ["true"], "x": object()}}, "args"),
        ({"required_capabilities": "gpu"}, "required_capabilities"),
        ({"required_capabilities": ["ok", ""]}, "required_capabilities"),
        ({"required_capabilities": [1]}, "required_capabilities"),
        ({"library_ref": ""}, "library_ref"),
        ({"args": {"argv": "true"}}, "args.argv"),
        ({"args": {"argv": ["rm", "-rf", "/"]}}, "args.argv[0]"),
    ],
)
async def test_invalid_applications_name_the_field_and_write_nothing(
    db: StateDB, changes: dict[str, object], field: str
) -> None:
    with pytest.raises(TaskValidationError) as info:
        await submit_task(db, app(**changes), registry=REGISTRY)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)
    assert await count_runs(db) == 0


async def test_unknown_kind_lists_registered_kinds_and_aliases(db: StateDB) -> None:
    with pytest.raises(AdapterNotRegistered) as info:
        await submit_task(db, app(action_kind="shel"), registry=REGISTRY)
    message = str(info.value)
    assert "'shel'" in message and "command" in message and "python" in message
    assert "playbook -> play" in message
    assert info.value.field == "action_kind"
    assert await count_runs(db) == 0


async def test_unknown_target_lists_the_closed_set(db: StateDB) -> None:
    with pytest.raises(TaskValidationError) as info:
        await submit_task(db, app(execution_target="cloud"), registry=REGISTRY)
    for target in ("host", "local_worktree", "daytona", "remote_agent", "process"):
        assert target in str(info.value)


async def test_args_over_the_size_bound_are_rejected(db: StateDB) -> None:
    big = {"argv": ["true"], "pad": "x" * MAX_ARGS_BYTES}
    with pytest.raises(TaskValidationError) as info:
        await submit_task(db, app(args=big), registry=REGISTRY)
    assert info.value.field == "args"
    assert await count_runs(db) == 0


async def test_serialization_capability_derives_a_host_scoped_concurrency_key(
    db: StateDB,
) -> None:
    task_id = await submit_task(
        db, app(required_capabilities=["gpu-exclusive", "linux"]), registry=REGISTRY
    )
    row = await taskward.get_task(db, task_id)
    assert row["concurrency_key"].endswith(":gpu-exclusive")


async def test_workflow_is_not_registered_without_a_library(db: StateDB) -> None:
    with pytest.raises(AdapterNotRegistered):
        await submit_task(db, app(action_kind="workflow", args={}), registry=REGISTRY)


def test_hash_covers_exactly_the_six_fields_and_not_the_key() -> None:
    a = validate_application(app(idempotency_key="one"), REGISTRY)
    b = validate_application(app(idempotency_key="two"), REGISTRY)
    assert a.application_hash == b.application_hash
    c = validate_application(app(library_ref="lib@1"), REGISTRY)
    assert c.application_hash != a.application_hash


def test_the_key_is_trimmed() -> None:
    assert validate_application(app(idempotency_key="  k  "), REGISTRY).idempotency_key == "k"


async def test_default_registry_is_used_when_none_is_given(db: StateDB) -> None:
    task_id = await submit_task(db, app(action_kind="agent", args={"objective": "x"}))
    assert (await taskward.get_task(db, task_id))["action_kind"] == "agent"
    with pytest.raises(TaskValidationError):  # command allowlist is empty by default
        await submit_task(db, app(idempotency_key="other"))


@pytest.mark.parametrize(
    "args,caps,ref,lib_hash",
    [
        ({}, [], None, None),
        ({"b": [1, {"z": None, "a": "é"}], "a": 1.5}, ["x", "y"], "lib@1", "sha256:00"),
    ],
)
def test_spliced_hash_equals_the_hash_of_the_canonical_dict(
    args: dict[str, object], caps: list[str], ref: str | None, lib_hash: str | None
) -> None:
    from taskward.admission import application_hash_of
    from taskward.canonical import canonical_json, content_hash

    expected = content_hash(
        {
            "action_kind": "command",
            "args": args,
            "execution_target": "host",
            "required_capabilities": caps,
            "library_ref": ref,
            "library_content_hash": lib_hash,
        }
    )
    assert (
        application_hash_of("command", canonical_json(args), "host", caps, ref, lib_hash)
        == expected
    )


# -- bulk admission ----------------------------------------------------------------------------


async def test_submit_tasks_admits_in_order_with_per_key_semantics(db: StateDB) -> None:
    from taskward import submit_tasks

    first = await submit_task(db, app(idempotency_key="old"), registry=REGISTRY)
    apps = [app(idempotency_key=f"bulk-{i}") for i in range(50)]
    apps.insert(10, app(idempotency_key="old"))  # a replay returns the original id
    apps.append(app(idempotency_key="bulk-3"))  # the same key twice is one task
    ids = await submit_tasks(db, apps, registry=REGISTRY)
    assert len(ids) == 52 and ids[10] == first and ids[-1] == ids[3]
    assert len(set(ids)) == 51
    assert await count_runs(db) == 51
    row = await taskward.get_task(db, ids[0])
    assert row["status"] == "queued" and row["idempotency_key"] == "bulk-0"


async def test_submit_tasks_is_all_or_nothing(db: StateDB) -> None:
    from taskward import submit_tasks

    first = await submit_task(db, app(idempotency_key="taken"), registry=REGISTRY)
    with pytest.raises(TaskIdempotencyConflict) as info:
        await submit_tasks(
            db,
            [app(idempotency_key="n1"), app(idempotency_key="taken", execution_target="process")],
            registry=REGISTRY,
        )
    assert info.value.existing_task_id == first
    with pytest.raises(TaskValidationError, match="application 1"):
        await submit_tasks(
            db, [app(idempotency_key="n2"), app(idempotency_key="")], registry=REGISTRY
        )
    with pytest.raises(TaskValidationError, match="two different"):
        await submit_tasks(
            db,
            [app(idempotency_key="n3"), app(idempotency_key="n3", execution_target="process")],
            registry=REGISTRY,
        )
    assert await count_runs(db) == 1
