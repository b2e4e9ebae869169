"""``taskward task submit`` with the scheduling fields (DESIGN.md R15-R18) and ``taskward
limit|pause|resume`` (R20), as real subprocesses on both backends."""

from __future__ import annotations

import time

from taskward.cli.errors import EXIT_BAD_INPUT, EXIT_OK
from tests.acceptance.test_cli import Taskward, assert_no_traceback
from tests.acceptance.test_cli import taskward as taskward

ENV = {"TASKWARD_COMMAND_ALLOWLIST": "true"}
TRUE = ("command", "--args", '{"argv": ["true"]}')


def submit(taskward: Taskward, *extra: str) -> dict[str, object]:
    run = taskward("task", "submit", *TRUE, *extra, "--json", env=ENV)
    assert run.code == EXIT_OK, run.stderr
    task_id = run.json()["task_id"]
    shown = taskward("task", "show", task_id, "--json", env=ENV)
    assert shown.code == EXIT_OK, shown.stderr
    row: dict[str, object] = shown.json()
    return row


def test_submit_stores_each_scheduling_option(taskward: Taskward) -> None:
    row = submit(
        taskward,
        "--run-after",
        "2100-01-01T00:00:00Z",
        "--priority",
        "-3",
        "--max-attempts",
        "7",
        "--limit-key",
        "tenant:a",
    )
    assert (row["run_after"], row["priority"], row["max_attempts"], row["limit_key"]) == (
        4102444800.0,
        -3,
        7,
        "tenant:a",
    )
    placement = row["placement"]
    assert isinstance(placement, dict)
    assert placement["reason"] == "delayed: runs at 2100-01-01T00:00:00Z (run_after)"
    epoch = submit(taskward, "--run-after", "4102444800")
    assert epoch["run_after"] == 4102444800.0


def test_delay_is_relative_and_a_retry_with_the_key_replays(taskward: Taskward) -> None:
    before = time.time()
    first = taskward("task", "submit", *TRUE, "--delay", "2h", "--key", "d-1", "--json", env=ENV)
    again = taskward("task", "submit", *TRUE, "--delay", "2h", "--key", "d-1", "--json", env=ENV)
    assert first.code == again.code == EXIT_OK, (first.stderr, again.stderr)
    assert first.json()["task_id"] == again.json()["task_id"]
    row = taskward("task", "show", first.json()["task_id"], "--json", env=ENV).json()
    assert before + 7199 <= row["run_after"] <= time.time() + 7201


def test_bad_scheduling_options_exit_2_naming_them(taskward: Taskward) -> None:
    for args, named in [
        (("--priority", "101"), "priority"),
        (("--max-attempts", "0"), "max_attempts"),
        (("--delay", "soon"), "--delay"),
        (("--run-after", "yesterday"), "--run-after"),
        (("--limit-key", "kind:x"), "limit_key"),
    ]:
        run = taskward("task", "submit", *TRUE, *args, env=ENV)
        assert run.code == EXIT_BAD_INPUT, (args, run.stderr)
        assert named in run.stderr, (args, run.stderr)
        assert_no_traceback(run)
    both = taskward("task", "submit", *TRUE, "--delay", "5s", "--run-after", "1", env=ENV)
    assert both.code != EXIT_OK and "not both" in both.stderr
    listed = taskward("task", "list", "--json", env=ENV)
    assert listed.json()["tasks"] == []


def test_limits_and_pauses_from_the_terminal(taskward: Taskward) -> None:
    row = submit(taskward)
    set_ = taskward("limit", "set", "tenant:a", "--max-running", "2", "--rate", "5", "--per", "1m")
    assert set_.code == EXIT_OK, set_.stderr
    assert "tenant:a" in set_.stdout and "5 per 60s" in set_.stdout
    paused = taskward("pause", "command")
    assert paused.code == EXIT_OK and paused.stdout.strip() == "paused kind:command"
    shown = taskward("task", "show", str(row["id"]), "--json", env=ENV).json()
    assert shown["placement"]["reason"] == "held by limit kind:command: paused (max_running 0)"
    listed = taskward("limit", "list", "--json").json()
    assert [(x["limit_key"], x["max_running"], x["rate"]) for x in listed] == [
        ("kind:command", 0, None),
        ("tenant:a", 2, 5),
    ]
    assert taskward("resume", "command").stdout.strip() == "resumed kind:command"
    assert taskward("resume", "command").stdout.strip() == "kind:command was not paused"
    assert taskward("limit", "clear", "tenant:a").stdout.strip() == "cleared tenant:a"
    assert taskward("limit", "list").stdout.strip() == "no limits"
    bad = taskward("limit", "set", "tenant:a", "--rate", "5")
    assert bad.code == EXIT_BAD_INPUT and "rate" in bad.stderr
    assert_no_traceback(bad)
