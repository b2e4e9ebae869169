"""The ``taskward`` CLI driven as a user drives it, against a real store: in-process through
click's runner (``tests.acceptance.clirun``), and as a real process where the process is the
point (the console script, ``python -m``, what a start imports).

Every test runs on SQLite and PostgreSQL (the ``db_url`` fixture) and passes ``--db``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from taskward.cli.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from tests.acceptance.clirun import Run, run_cli, run_process

GENERATED_KEY = re.compile(r"cli:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


Taskward = Callable[..., Run]


@pytest.fixture
def taskward(db_url: str, tmp_path: Path) -> Taskward:
    """``taskward --db <db_url> ARGS`` in-process, from ``tmp_path``, without TASKWARD_*."""

    def run(*args: str, env: Mapping[str, str] | None = None) -> Run:
        return run_cli(db_url, *args, env=env, cwd=tmp_path)

    return run


@pytest.fixture
def taskward_process(db_url: str, tmp_path: Path) -> Taskward:
    """``python -m taskward.cli.main --db <db_url> ARGS``: a real process."""

    def run(*args: str, env: Mapping[str, str] | None = None) -> Run:
        return run_process(db_url, *args, env=env, cwd=tmp_path)

    return run


@pytest.fixture
def taskward_script(db_url: str, tmp_path: Path) -> Taskward:
    """Run the installed ``taskward`` console script, as a user's shell would."""
    script = Path(sys.executable).parent / "taskward"
    if not script.exists():
        pytest.skip(f"no console script at {script}; install the package")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}

    def run(*args: str, env: Mapping[str, str] | None = None) -> Run:
        proc = subprocess.run(
            [str(script), "--db", db_url, *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**base_env, **(env or {})},
            timeout=60,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)

    return run


def assert_no_traceback(run: Run) -> None:
    assert "Traceback" not in run.stderr, run.stderr


def test_migrate_twice_the_second_is_a_no_op(taskward_process: Taskward) -> None:
    """A real process: `python -m taskward.cli.main` end to end."""
    first = taskward_process("migrate")
    assert first.code == EXIT_OK, first.stderr
    assert "applied 0001_initial" in first.stdout

    second = taskward_process("migrate", "--json")
    assert second.code == EXIT_OK, second.stderr
    assert second.json() == {"applied": []}


def test_submit_show_list_and_history_of_a_new_task(taskward: Taskward) -> None:
    submitted = taskward(
        "task",
        "submit",
        "playbook",
        "--args",
        '{"name": "deploy", "n": 2}',
        "--capability",
        "gpu",
        "--capability",
        "gpu",
        "--key",
        "deploy-1",
        "--json",
    )
    assert submitted.code == EXIT_OK, submitted.stderr
    out = submitted.json()
    assert out["idempotency_key"] == "deploy-1"
    assert out["key_generated"] is False
    task_id = out["task_id"]
    assert UUID.match(task_id)

    row = taskward("task", "show", task_id, "--json").json()
    assert row["id"] == task_id
    assert row["action_kind"] == "play"  # playbook is normalised before storage (R8)
    assert row["action_args"] == {"name": "deploy", "n": 2}
    assert row["required_capabilities"] == ["gpu"]
    assert row["status"] == "queued"
    assert row["admission_source"] == "cli"

    shown = taskward("task", "show", task_id)
    assert shown.code == EXIT_OK, shown.stderr
    assert task_id in shown.stdout
    assert '"name": "deploy"' in shown.stdout  # JSON columns pretty-printed

    listed = taskward("task", "list")
    assert listed.code == EXIT_OK, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if task_id in ln)
    assert line.split()[:4] == [task_id, "queued", "play", "0/3"]  # tries: made/allowed

    history = taskward("task", "history", task_id, "--json")
    assert history.code == EXIT_OK, history.stderr
    assert history.json() == {  # admission writes no fact
        "task_id": task_id,
        "transitions": [],
        "cancel_requests": [],
    }


def test_a_generated_key_is_printed_and_retrying_with_it_returns_the_same_task(
    taskward: Taskward,
) -> None:
    first = taskward("task", "submit", "agent", "--args", '{"objective": "tidy"}')
    assert first.code == EXIT_OK, first.stderr
    task_id = first.stdout.strip()
    assert UUID.match(task_id)
    match = GENERATED_KEY.search(first.stderr)
    assert match, first.stderr
    key = match.group(0)
    assert f"--key {key}" in first.stderr

    retried = taskward(
        "task", "submit", "agent", "--args", '{"objective": "tidy"}', "--key", key, "--json"
    )
    assert retried.code == EXIT_OK, retried.stderr
    assert retried.json() == {"task_id": task_id, "idempotency_key": key, "key_generated": False}
    assert GENERATED_KEY.search(retried.stderr) is None


def test_the_same_key_with_different_args_exits_1_naming_the_existing_task(
    taskward: Taskward,
) -> None:
    task_id = taskward("task", "submit", "agent", "--args", '{"a": 1}', "--key", "k").stdout.strip()

    conflict = taskward("task", "submit", "agent", "--args", '{"a": 2}', "--key", "k")
    assert conflict.code == EXIT_FAILURE
    assert task_id in conflict.stderr
    assert conflict.stdout == ""
    assert len(conflict.stderr.strip().splitlines()) == 1
    assert_no_traceback(conflict)

    as_json = taskward("task", "submit", "agent", "--args", '{"a": 2}', "--key", "k", "--json")
    assert as_json.code == EXIT_FAILURE
    error = json.loads(as_json.stderr)
    assert error["error"] == "TaskIdempotencyConflict"
    assert error["existing_task_id"] == task_id


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["task", "submit", "shel"], ["action_kind", "'shel'", "command", "python", "play"]),
        (["task", "submit", "agent", "--args", "{not json"], ["--args", "JSON"]),
        (["task", "submit", "agent", "--args", "[1, 2]"], ["--args", "JSON object"]),
        (
            ["task", "submit", "agent", "--target", "mars"],
            ["--target", "'mars'", "host", "local_worktree", "daytona", "remote_agent", "process"],
        ),
        (
            ["task", "submit", "command", "--args", '{"argv": ["echo", "hi"]}'],
            ["args.argv[0]", "allowlist"],
        ),
        (["--import", "no_such_module_xyz", "task", "submit", "agent"], ["--import"]),
    ],
    ids=[
        "unknown-kind",
        "bad-json",
        "args-not-object",
        "unknown-target",
        "not-allowlisted",
        "bad-import",
    ],
)
def test_bad_input_exits_2_naming_the_field_and_writes_nothing(
    taskward: Taskward, argv: list[str], named: list[str]
) -> None:
    rejected = taskward(*argv)
    assert rejected.code == EXIT_BAD_INPUT, rejected.stderr
    assert rejected.stdout == ""
    assert_no_traceback(rejected)
    for word in named:
        assert word in rejected.stderr
    assert GENERATED_KEY.search(rejected.stderr) is None  # no key announced for a rejection

    listed = taskward("task", "list", "--json")
    assert listed.code == EXIT_OK, listed.stderr
    assert listed.json() == {"tasks": [], "next_cursor": None}


def test_an_allowlisted_command_is_admitted(taskward: Taskward) -> None:
    submitted = taskward(
        "task",
        "submit",
        "command",
        "--args",
        '{"argv": ["echo", "hi"]}',
        env={"TASKWARD_COMMAND_ALLOWLIST": "true,echo"},
    )
    assert submitted.code == EXIT_OK, submitted.stderr
    assert UUID.match(submitted.stdout.strip())


def test_cancel_of_a_queued_task_is_immediate_and_recorded(taskward: Taskward) -> None:
    task_id = taskward("task", "submit", "agent", "--key", "c1").stdout.strip()

    cancelled = taskward(
        "task", "cancel", task_id, "--key", "stop-1", "--reason", "not needed", "--json"
    )
    assert cancelled.code == EXIT_OK, cancelled.stderr
    assert cancelled.json() == {
        "task_id": task_id,
        "state": "cancelled",
        "current_status": "cancelled",
        "idempotency_key": "stop-1",
    }

    replayed = taskward("task", "cancel", task_id, "--key", "stop-1")
    assert replayed.code == EXIT_OK, replayed.stderr
    assert replayed.stdout.strip() == "cancelled (status: cancelled)"

    history = taskward("task", "history", task_id)
    assert history.code == EXIT_OK, history.stderr
    fact = next(ln for ln in history.stdout.splitlines() if "->" in ln)
    assert "queued -> cancelled" in fact
    assert "not needed" in fact
    assert "operator:" in fact


def test_task_retry_runs_an_ended_task_again_as_a_new_one(taskward: Taskward) -> None:
    """R19 through the CLI: a queued task is refused (exit 1, nothing admitted); once it ended,
    ``task retry`` prints the new task's id, the same --key the same id, and the new task keeps
    the original's application."""
    task_id = taskward("task", "submit", "agent", "--key", "r1").stdout.strip()
    refused = taskward("task", "retry", task_id, "--key", "again")
    assert refused.code == EXIT_FAILURE
    assert "only a terminal task" in refused.stderr and task_id in refused.stderr
    assert taskward("task", "cancel", task_id, "--key", "stop").code == EXIT_OK

    retried = taskward("task", "retry", task_id, "--key", "again", "--json")
    assert retried.code == EXIT_OK, retried.stderr
    answer = retried.json()
    assert answer["retry_of"] == task_id and answer["idempotency_key"] == "again"
    new_id = answer["task_id"]
    assert UUID.match(new_id) and new_id != task_id
    assert taskward("task", "retry", task_id, "--key", "again").stdout.strip() == new_id
    new = taskward("task", "show", new_id, "--json").json()
    old = taskward("task", "show", task_id, "--json").json()
    assert (new["status"], old["status"]) == ("queued", "cancelled")
    assert new["action_kind"] == old["action_kind"]
    assert new["idempotency_key"] == f"retry:{task_id}:again"

    bad = taskward("task", "retry", task_id, "--key", "")
    assert bad.code == EXIT_BAD_INPUT and "generated idempotency key" not in bad.stderr


def test_a_bad_cancel_reason_exits_2_before_a_key_is_announced(taskward: Taskward) -> None:
    task_id = taskward("task", "submit", "agent", "--key", "c2").stdout.strip()
    refused = taskward("task", "cancel", task_id, "--reason", "x" * 1001)
    assert refused.code == EXIT_BAD_INPUT, refused.stderr
    assert "reason" in refused.stderr and "generated idempotency key" not in refused.stderr
    assert taskward("task", "show", task_id, "--json").json()["status"] == "queued"


def test_show_history_and_cancel_of_a_missing_task_exit_1(taskward: Taskward) -> None:
    for argv in (
        ["task", "show", "no-such-task"],
        ["task", "history", "no-such-task"],
        ["task", "cancel", "no-such-task", "--key", "x"],
    ):
        missing = taskward(*argv)
        assert missing.code == EXIT_FAILURE
        assert missing.stderr.strip() == "taskward: error: task 'no-such-task' not found"
        assert missing.stdout == ""


def test_list_filters_by_status_newest_first_and_pages(taskward: Taskward) -> None:
    first = taskward("task", "submit", "agent", "--key", "l1").stdout.strip()
    second = taskward("task", "submit", "flow", "--key", "l2").stdout.strip()
    third = taskward("task", "submit", "agent", "--key", "l3").stdout.strip()
    assert taskward("task", "cancel", second, "--key", "x").code == EXIT_OK

    queued = taskward("task", "list", "--status", "queued", "--json").json()
    assert [t["id"] for t in queued["tasks"]] == [third, first]
    cancelled = taskward("task", "list", "--status", "cancelled").stdout
    assert second in cancelled
    assert first not in cancelled

    page = taskward("task", "list", "--limit", "2")
    assert page.code == EXIT_OK
    cursor = re.search(r"--cursor (\S+)", page.stdout)
    assert cursor, page.stdout
    rest = taskward("task", "list", "--limit", "2", "--cursor", cursor.group(1), "--json").json()
    assert [t["id"] for t in rest["tasks"]] == [first]
    assert rest["next_cursor"] is None

    bad = taskward("task", "list", "--status", "done")
    assert bad.code == EXIT_BAD_INPUT
    assert "--status" in bad.stderr


def test_the_console_script_imports_task_modules_from_the_working_directory(
    taskward_script: Taskward, tmp_path: Path
) -> None:
    (tmp_path / "cli_greetings.py").write_text(
        "import taskward\n\n\n@taskward.task('greet')\ndef greet(name: str) -> str:\n"
        "    return f'hello {name}'\n"
    )
    submitted = taskward_script(
        "--import",
        "cli_greetings",
        "task",
        "submit",
        "greet",
        "--args",
        '{"name": "ada"}',
        "--key",
        "g1",
        "--json",
    )
    assert submitted.code == EXIT_OK, submitted.stderr
    task_id = submitted.json()["task_id"]

    row = taskward_script("task", "show", task_id, "--json").json()
    assert row["action_kind"] == "greet"

    unknown = taskward_script("task", "submit", "greet")  # not imported: not registered
    assert unknown.code == EXIT_BAD_INPUT
    assert "registered kinds" in unknown.stderr


def test_the_cli_and_its_worker_start_without_the_commands_they_do_not_run() -> None:
    """``schedule``, ``outbox``, ``serve`` and rich's tables load when used, not
    with the CLI: every worker (and every one-line command) starts without them."""
    probe = (
        "import sys, taskward.cli.main, taskward.cli.worker_cmd\n"
        "heavy = ['rich', 'statistics', 'taskward.cli.schedule_cmd', 'taskward.cli.outbox_cmd',\n"
        "         'taskward.cli.serve_cmd', 'starlette', 'uvicorn']\n"
        "print([name for name in heavy if name in sys.modules])\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
