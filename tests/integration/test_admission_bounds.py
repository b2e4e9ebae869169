"""Bounded, printable, storable input at admission, cancellation and schedules, on both
backends: each rejection is a TaskValidationError naming the field, and nothing is stored.

- ``args.timeout_s`` of every kind is a number of seconds in (0, the deployment's maximum]
  (default 7 days; ``TASKWARD_MAX_TASK_TIMEOUT_S``): a claim turns it into ``deadline_at``
  (R5), and 1e308 is a deadline no timestamp can hold.
- idempotency keys are 1..255 printable characters; capabilities at most 32 labels of at most
  128 printable characters; ``python``'s ``module:function`` is matched whole.
- every text field is valid UTF-8 without NUL (a lone surrogate failed in SQLite's driver).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import taskward
from taskward import Actor, TaskApplication, request_task_cancel, submit_task, submit_tasks
from taskward.adapters import AdapterConfig, build_registry
from taskward.adapters.python import task as task_decorator
from taskward.admission import MAX_CAPABILITIES, MAX_CAPABILITY_LENGTH, MAX_KEY_LENGTH
from taskward.errors import ScheduleNotFound, TaskNotFound, TaskValidationError
from taskward.registry import DEFAULT_MAX_TASK_TIMEOUT_S, TaskAdapterRegistry
from taskward.schedules import create_schedule, fire_schedule, get_schedule, list_schedules
from taskward.store.port import StateDB

CONFIG = AdapterConfig(
    command_allowlist=frozenset({"true", "echo"}),
    python_modules=frozenset({"json"}),
    imports=("tests.integration.worker_tasks",),
)
REGISTRY = build_registry(CONFIG)
OPERATOR = Actor(type="operator", id="ops")
SURROGATE = "x\ud800"
WEEK = 7 * 24 * 3600


def app(**changes: Any) -> TaskApplication:
    base = TaskApplication(
        action_kind="command",
        args={"argv": ["true"]},
        execution_target="host",
        idempotency_key="key-1",
    )
    return dataclasses.replace(base, **changes)


async def stored(db: StateDB) -> int:
    rows, _ = await taskward.list_tasks(db, limit=500)
    return len(rows)


async def refused(db: StateDB, application: TaskApplication, field: str, **kwargs: Any) -> str:
    """Admission refuses ``application`` naming ``field``, alone and in a bulk call; nothing
    is stored. Returns the error's ``allowed``."""
    with pytest.raises(TaskValidationError) as alone:
        await submit_task(db, application, registry=kwargs.get("registry", REGISTRY))
    assert alone.value.field == field, alone.value
    with pytest.raises(TaskValidationError) as bulk:
        await submit_tasks(
            db,
            [app(idempotency_key="fine"), application],
            registry=kwargs.get("registry", REGISTRY),
        )
    assert bulk.value.field == field
    assert await stored(db) == 0
    return alone.value.allowed


# -- args.timeout_s, every kind ----------------------------------------------------------------

KINDS: list[tuple[str, dict[str, Any]]] = [
    ("command", {"argv": ["true"]}),
    ("python", {"function": "json:dumps", "kwargs": {"obj": 1}}),
    ("agent", {"objective": "tidy"}),
    ("nap", {"seconds": 0}),  # a @taskward.task function's own kind (it takes timeout_s)
    ("noop", {}),  # one that does not: the worker keeps timeout_s for the deadline (R5)
]


@pytest.mark.parametrize(("kind", "args"), KINDS, ids=[k for k, _ in KINDS])
@pytest.mark.parametrize(
    "timeout",
    [1e308, 1e12, WEEK + 1, WEEK + 0.001, 10**400, 0, -1, -0.0, True, False, "60", [60], math.nan],
    ids=repr,
)
async def test_a_timeout_out_of_range_is_refused_for_every_kind(
    db: StateDB, kind: str, args: dict[str, Any], timeout: Any
) -> None:
    application = app(action_kind=kind, args={**args, "timeout_s": timeout})
    # NaN is not JSON at all: refused as args before its range is looked at.
    not_json = isinstance(timeout, float) and math.isnan(timeout)
    allowed = await refused(db, application, "args" if not_json else "args.timeout_s")
    if not not_json:
        assert "604800" in allowed and "> 0" in allowed


@pytest.mark.parametrize(("kind", "args"), KINDS, ids=[k for k, _ in KINDS])
@pytest.mark.parametrize("timeout", [WEEK, 1, 0.5, 1e-3, None], ids=repr)
async def test_a_timeout_in_range_or_absent_is_admitted(
    db: StateDB, kind: str, args: dict[str, Any], timeout: Any
) -> None:
    task_id = await submit_task(
        db, app(action_kind=kind, args={**args, "timeout_s": timeout}), registry=REGISTRY
    )
    assert (await taskward.get_task(db, task_id))["action_args"]["timeout_s"] == timeout


async def test_the_maximum_is_the_deployments_and_is_injectable(db: StateDB) -> None:
    hour = build_registry(dataclasses.replace(CONFIG, max_task_timeout_s=3600))
    assert hour.max_task_timeout_s == 3600.0
    allowed = await refused(
        db, app(args={"argv": ["true"], "timeout_s": 3601}), "args.timeout_s", registry=hour
    )
    assert "3600" in allowed
    await submit_task(db, app(args={"argv": ["true"], "timeout_s": 3600}), registry=hour)
    # The default registry (no configuration) allows 7 days.
    assert build_registry().max_task_timeout_s == DEFAULT_MAX_TASK_TIMEOUT_S == WEEK


def test_the_maximum_is_read_from_the_environment() -> None:
    assert AdapterConfig.from_env({}).max_task_timeout_s == WEEK
    assert AdapterConfig.from_env({"TASKWARD_MAX_TASK_TIMEOUT_S": " "}).max_task_timeout_s == WEEK
    env = {"TASKWARD_MAX_TASK_TIMEOUT_S": "86400"}
    assert build_registry(AdapterConfig.from_env(env)).max_task_timeout_s == 86400.0
    for bad in ("soon", "0", "-5", "nan", "inf", "1e308"):
        with pytest.raises(TaskValidationError) as caught:
            AdapterConfig.from_env({"TASKWARD_MAX_TASK_TIMEOUT_S": bad})
        assert caught.value.field == "TASKWARD_MAX_TASK_TIMEOUT_S"
    for bad_max in (0, -1.0, math.inf, True, 1e12):
        with pytest.raises(TaskValidationError):
            TaskAdapterRegistry(max_task_timeout_s=bad_max)


async def test_a_schedule_template_with_an_unbounded_timeout_is_refused(db: StateDB) -> None:
    with pytest.raises(TaskValidationError) as caught:
        await create_schedule(
            db,
            name="forever",
            action_kind="agent",
            args={"timeout_s": 1e308},
            cron="@daily",
            registry=REGISTRY,
        )
    assert caught.value.field == "args.timeout_s"
    assert await list_schedules(db, include_removed=True) == []


# -- idempotency keys --------------------------------------------------------------------------

BAD_KEYS = [
    "a\tb",
    "line\nforged",
    "cr\rx",
    "bell\x07",
    "del\x7f",
    "esc\x1b[31m",
    "nbsp\u00a0x",  # a separator other than the space
    "zw\u200bx",  # a format character: invisible, so a key nobody can type again
    "x\x00",
    SURROGATE,
    "k" * (MAX_KEY_LENGTH + 1),
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
async def test_an_unprintable_or_long_admission_key_is_refused(db: StateDB, key: str) -> None:
    await refused(db, app(idempotency_key=key), "idempotency_key")


@pytest.mark.parametrize(
    "key", ["nightly report 2026", "été:ß:日本", "k" * MAX_KEY_LENGTH, "  padded  "], ids=repr
)
async def test_printable_keys_with_spaces_and_any_script_are_admitted(
    db: StateDB, key: str
) -> None:
    task_id = await submit_task(db, app(idempotency_key=key), registry=REGISTRY)
    assert (await taskward.get_task(db, task_id))["idempotency_key"] == key.strip()


@pytest.mark.parametrize("key", [*BAD_KEYS, "", "  "], ids=repr)
async def test_an_unprintable_cancel_key_is_refused_and_changes_nothing(
    db: StateDB, key: str
) -> None:
    task_id = await submit_task(db, app(), registry=REGISTRY)
    with pytest.raises(TaskValidationError) as caught:
        await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key=key)
    assert caught.value.field == "idempotency_key"
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert await taskward.list_transitions(db, task_id) == []


@pytest.mark.parametrize("reason", ["why\x00", SURROGATE, "r" * 1001], ids=repr)
async def test_an_unstorable_or_long_cancel_reason_is_refused(db: StateDB, reason: str) -> None:
    task_id = await submit_task(db, app(), registry=REGISTRY)
    with pytest.raises(TaskValidationError) as caught:
        await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c", reason=reason)
    assert caught.value.field == "reason"
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert await taskward.list_task_events(db, task_id) == []


@pytest.mark.parametrize("task_id", ["x\x00", SURROGATE], ids=repr)
async def test_a_task_id_no_row_can_have_is_not_found(db: StateDB, task_id: str) -> None:
    with pytest.raises(TaskNotFound):
        await request_task_cancel(db, task_id, actor=OPERATOR, idempotency_key="c")


async def test_a_manual_fire_key_follows_the_key_rule(db: StateDB) -> None:
    row = await create_schedule(
        db,
        name="s",
        action_kind="command",
        args={"argv": ["true"]},
        cron="@daily",
        registry=REGISTRY,
    )
    for key in (f"manual:{row['id']}:\n", SURROGATE, "m" * 300):
        with pytest.raises(TaskValidationError) as caught:
            await fire_schedule(db, row["id"], idempotency_key=key, registry=REGISTRY)
        assert caught.value.field == "idempotency_key"
    assert await stored(db) == 0
    for ref in ("s\x00", SURROGATE):
        with pytest.raises(ScheduleNotFound):
            await get_schedule(db, ref)


# -- capabilities ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "capabilities",
    [
        [f"c{i}" for i in range(MAX_CAPABILITIES + 1)],
        ["g" * (MAX_CAPABILITY_LENGTH + 1)],
        ["x" * 100_000],
        ["gpu\n"],
        ["g\tpu"],
        ["gpu\x00"],
        [SURROGATE],
        [""],
        [" gpu"],
    ],
    ids=lambda caps: f"{len(caps)}x{len(caps[0])}:{caps[0][:6]!r}",
)
async def test_too_many_long_or_unprintable_capabilities_are_refused(
    db: StateDB, capabilities: list[str]
) -> None:
    await refused(db, app(required_capabilities=capabilities), "required_capabilities")


async def test_the_most_capabilities_of_the_longest_labels_are_admitted(db: StateDB) -> None:
    labels = [f"{i:02d}".ljust(MAX_CAPABILITY_LENGTH, "g") for i in range(MAX_CAPABILITIES)]
    task_id = await submit_task(db, app(required_capabilities=labels), registry=REGISTRY)
    assert (await taskward.get_task(db, task_id))["required_capabilities"] == sorted(labels)


# -- python function names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "function", ["json:dumps\n", "json:dumps\r\n", "json\n:dumps", "json:dumps ", "json:"], ids=repr
)
async def test_a_function_name_is_matched_whole(db: StateDB, function: str) -> None:
    await refused(db, app(action_kind="python", args={"function": function}), "args.function")


def test_a_task_kind_is_matched_whole() -> None:
    with pytest.raises(TaskValidationError):
        task_decorator("kind\n")(lambda: None)


# -- lone surrogates and NUL in every text field, through the library -------------------------


@pytest.mark.parametrize("bad", [SURROGATE, "x\x00"], ids=["surrogate", "nul"])
@pytest.mark.parametrize(
    "field",
    ["action_kind", "execution_target", "library_ref", "library_content_hash"],
)
async def test_unstorable_text_in_an_application_is_refused(
    db: StateDB, field: str, bad: str
) -> None:
    await refused(db, app(**{field: bad}), field)


@pytest.mark.parametrize("bad", [SURROGATE, "x\x00"], ids=["surrogate", "nul"])
@pytest.mark.parametrize(
    "field",
    [
        "name",
        "timezone",
        "cron",
        "misfire_policy",
        "overlap_policy",
        "action_kind",
        "execution_target",
    ],
)
async def test_unstorable_text_in_a_schedule_is_refused(db: StateDB, field: str, bad: str) -> None:
    definition: dict[str, Any] = {
        "name": "nightly",
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "cron": "@daily",
        field: bad,
    }
    with pytest.raises(TaskValidationError) as caught:
        await create_schedule(db, **definition, registry=REGISTRY)
    assert caught.value.field == field
    assert "\ud800" not in str(caught.value.value)  # the error carries the escaped text
    assert await list_schedules(db, include_removed=True) == []


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "n" * 201], ids=repr)
async def test_an_unprintable_or_long_schedule_name_is_refused(db: StateDB, name: str) -> None:
    with pytest.raises(TaskValidationError) as caught:
        await create_schedule(
            db,
            name=name,
            action_kind="command",
            args={"argv": ["true"]},
            cron="@daily",
            registry=REGISTRY,
        )
    assert caught.value.field == "name"
    assert await list_schedules(db, include_removed=True) == []
