"""``taskward kinds`` (issue 29): every kind this configuration registers, with its arguments'
JSON Schema where it has one, as a real subprocess (it reads no store, on either backend)."""

from __future__ import annotations

from pathlib import Path

from taskward.cli.errors import EXIT_BAD_INPUT, EXIT_OK
from tests.acceptance.test_cli import Taskward, assert_no_traceback
from tests.acceptance.test_cli import taskward as taskward

ROOT = str(Path(__file__).resolve().parents[2])
ENV = {"PYTHONPATH": ROOT, "TASKWARD_IMPORTS": "tests.fixtures.typed_tasks"}


def test_kinds_lists_builtins_and_typed_functions_with_their_schemas(taskward: Taskward) -> None:
    run = taskward("kinds", "--json", env=ENV)
    assert run.code == EXIT_OK, run.stderr
    by_kind = {row["kind"]: row for row in run.json()}
    assert {"command", "python", "weekly", "loose"} <= set(by_kind)
    weekly = by_kind["weekly"]
    assert weekly["target"] == "tests.fixtures.typed_tasks:weekly"
    assert weekly["args_schema"]["properties"]["week"]["type"] == "integer"
    assert weekly["args_schema"]["required"] == ["week"]
    assert by_kind["command"]["args_schema"] is None
    text = taskward("kinds", env=ENV)
    assert text.code == EXIT_OK, text.stderr
    line = next(row for row in text.stdout.splitlines() if row.strip().startswith("weekly"))
    assert "week: integer" in line and "when?: string | null" in line
    assert "PythonFunctionAdapter (tests.fixtures.typed_tasks:weekly)" in text.stdout
    assert max(len(row) for row in text.stdout.splitlines()) <= 80  # COLUMNS=80 (fixture)


def test_an_unknown_import_is_bad_input(taskward: Taskward) -> None:
    run = taskward("--import", "no_such_module_here", "kinds", env={"PYTHONPATH": ROOT})
    assert run.code == EXIT_BAD_INPUT
    assert "no_such_module_here" in run.stderr
    assert_no_traceback(run)
