"""``taskward schedule ...`` driven as a user drives it, in-process (``clirun``), against a
real store, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from taskward.cli.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from tests.acceptance.clirun import Run, run_cli

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MANUAL_KEY = re.compile(
    r"manual:([0-9a-f-]{36}):[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"
)


Taskward = Callable[..., Run]


@pytest.fixture
def taskward(db_url: str, tmp_path: Path) -> Taskward:
    """``taskward --db <db_url> ARGS`` in-process (``clirun``), ``true`` and ``echo`` allowed."""

    def run(*args: str) -> Run:
        done = run_cli(db_url, *args, env={"TASKWARD_COMMAND_ALLOWLIST": "true,echo"}, cwd=tmp_path)
        assert "Traceback" not in done.stderr, done.stderr
        return done

    return run


def add(taskward: Taskward, name: str, *extra: str) -> str:
    run = taskward("schedule", "add", name, "command", "--args", '{"argv": ["echo", "hi"]}', *extra)
    assert run.code == EXIT_OK, run.stderr
    schedule_id = run.stdout.strip()
    assert UUID.match(schedule_id)
    return schedule_id


def test_add_list_show_a_cron_schedule(taskward: Taskward) -> None:
    schedule_id = add(
        taskward,
        "morning",
        "--cron",
        "0 9 * * mon-fri",
        "--tz",
        "Europe/Berlin",
        "--misfire",
        "catch_up",
        "--catch-up-max",
        "3",
        "--overlap",
        "skip",
    )
    listing = taskward("schedule", "list")
    assert listing.code == EXIT_OK
    assert (
        schedule_id in listing.stdout and "cron 0 9 * * mon-fri (Europe/Berlin)" in listing.stdout
    )
    shown = taskward("schedule", "show", "morning", "--json").json()
    assert shown["id"] == schedule_id
    assert (shown["timezone"], shown["misfire_policy"], shown["catch_up_max"]) == (
        "Europe/Berlin",
        "catch_up",
        3,
    )
    assert (shown["overlap_policy"], shown["enabled"], shown["action_args"]) == (
        "skip",
        True,
        {"argv": ["echo", "hi"]},
    )
    assert isinstance(shown["next_fire_at"], int)
    human = taskward("schedule", "show", schedule_id)
    assert human.code == EXIT_OK and "next_fire_at" in human.stdout


def test_fire_prints_the_task_id_and_the_generated_key(taskward: Taskward) -> None:
    schedule_id = add(taskward, "hourly", "--every", "3600")
    fired = taskward("schedule", "fire", "hourly")
    assert fired.code == EXIT_OK, fired.stderr
    task_id = fired.stdout.strip()
    assert UUID.match(task_id)
    key = MANUAL_KEY.search(fired.stderr)
    assert key and key.group(1) == schedule_id
    task = taskward("task", "show", task_id, "--json").json()
    assert task["idempotency_key"] == key.group(0)
    assert (task["status"], task["schedule_id"], task["admission_source"]) == (
        "queued",
        schedule_id,
        "schedule",
    )
    # retrying with the printed key returns the same task
    again = taskward("schedule", "fire", schedule_id, "--key", key.group(0), "--json").json()
    assert (again["task_id"], again["key_generated"]) == (task_id, False)
    other = taskward("schedule", "fire", schedule_id, "--json").json()
    assert other["task_id"] != task_id and MANUAL_KEY.fullmatch(other["idempotency_key"])


def test_disable_enable_remove(taskward: Taskward) -> None:
    schedule_id = add(taskward, "nightly", "--every", "60")
    assert taskward("schedule", "disable", "nightly").stdout.strip() == f"disabled {schedule_id}"
    assert taskward("schedule", "show", schedule_id, "--json").json()["enabled"] is False
    enabled = taskward("schedule", "enable", schedule_id)
    assert enabled.code == EXIT_OK and enabled.stdout.startswith(f"enabled {schedule_id}")
    removed = taskward("schedule", "remove", "nightly")
    assert removed.stdout.strip() == f"removed {schedule_id}"
    # R11: disabled and marked removed, never deleted
    assert taskward("schedule", "list", "--json").json() == {"schedules": []}
    everything = taskward("schedule", "list", "--all", "--json").json()["schedules"]
    assert [s["id"] for s in everything] == [schedule_id]
    row = taskward("schedule", "show", schedule_id, "--json").json()
    assert row["enabled"] is False and row["removed_at"] is not None
    refused = taskward("schedule", "enable", schedule_id)
    assert refused.code == EXIT_BAD_INPUT and "removed" in refused.stderr
    refused = taskward("schedule", "fire", schedule_id)
    assert refused.code == EXIT_BAD_INPUT and "removed" in refused.stderr
    # the name is free again
    assert add(taskward, "nightly", "--every", "60") != schedule_id


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--cron", "61 * * * *"), "cron"),
        (("--cron", "0 9 * * *", "--tz", "Mars/Olympus"), "timezone"),
        (("--cron", "0 9 * * *", "--every", "60"), "--cron/--every"),
        ((), "--cron/--every"),
        (("--every", "0"), "--every"),
        (("--every", "60", "--misfire", "later"), "--misfire"),
        (("--every", "60", "--start-at", "yesterday"), "--start-at"),
    ],
)
def test_bad_input_exits_2_naming_the_field(
    taskward: Taskward, args: tuple[str, ...], needle: str
) -> None:
    run = taskward("schedule", "add", "bad", "command", "--args", '{"argv": ["true"]}', *args)
    assert run.code == EXIT_BAD_INPUT
    assert needle in run.stderr
    assert taskward("schedule", "list", "--all", "--json").json() == {"schedules": []}


def test_unknown_kind_exits_2_listing_the_registered_kinds(taskward: Taskward) -> None:
    run = taskward("schedule", "add", "bad", "shel", "--every", "60", "--json")
    assert run.code == EXIT_BAD_INPUT
    error = json.loads(run.stderr)
    assert error["field"] == "action_kind" and "command" in error["registered"]


def test_taken_name_exits_2_and_unknown_schedule_exits_1(taskward: Taskward) -> None:
    add(taskward, "dup", "--every", "60")
    run = taskward(
        "schedule", "add", "dup", "command", "--args", '{"argv": ["true"]}', "--every", "60"
    )
    assert run.code == EXIT_BAD_INPUT and "already used" in run.stderr
    for command in ("show", "enable", "disable", "remove", "fire"):
        missing = taskward("schedule", command, "nope")
        assert missing.code == EXIT_FAILURE, command
        assert "schedule 'nope' not found" in missing.stderr
