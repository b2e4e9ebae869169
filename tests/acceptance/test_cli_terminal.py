"""The CLI at a terminal's width (issue 28, item 2), in-process (``clirun``), on SQLite and
PostgreSQL: tables fit 80 columns with every field a reader needs, ``task show`` is one line
per field, ``task history`` one line per change (cancel requests and their reason included),
``task wait`` tells why a task failed, ``--args`` reads a file or stdin, ``--version``, and no
notice about a generated key where no key matters."""

from __future__ import annotations

import json
import re
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

import taskward
from taskward.claims import WorkerSpec, claim_runs
from taskward.cli.common import MAX_ARGS_TEXT_BYTES
from taskward.cli.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK
from taskward.cli.tasklines import TaskLines
from taskward.execution import RetryPolicy
from taskward.schedules import create_schedule
from taskward.store import StateDB
from tests.acceptance.clirun import Run, arun_cli

RETRY = "tests.fixtures.retry_tasks"
REGISTRY = taskward.build_registry(
    taskward.AdapterConfig(
        imports=(RETRY,), python_modules=frozenset({RETRY}), command_allowlist=frozenset({"sh"})
    )
)
NARROW = {"COLUMNS": "80"}
T0 = 1_000_000.0


async def submit(
    db: StateDB, kind: str, args: dict[str, Any], *, now: float = T0, **fields: Any
) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args,
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
        **fields,
    )
    return await taskward.submit_task(db, app, registry=REGISTRY, now=now)


async def run_at(db: StateDB, now: float) -> int:
    from taskward.maintenance.reaper import promote_due_retries

    await promote_due_retries(db, now=now)
    return await taskward.claim_and_execute(
        db, worker_id="host:terminal", registry=REGISTRY, now=now, retry_policy=RetryPolicy()
    )


async def failed_three_times(db: StateDB) -> str:
    """A task that failed each of its 3 attempts: 8 transitions (picky retries ValueError)."""
    task_id = await submit(db, "picky", {"error": "ValueError"})
    await run_at(db, T0)
    await run_at(db, T0 + 30)
    await run_at(db, T0 + 120)
    return task_id


def assert_fits(run: Run, width: int = 80) -> list[str]:
    assert run.code == EXIT_OK, run.stderr
    lines = run.stdout.splitlines()
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, "\n".join(too_long)
    return lines


async def test_history_of_eight_transitions_is_eight_lines_at_80_columns(
    db: StateDB, db_url: str
) -> None:
    task_id = await failed_three_times(db)
    facts = await taskward.list_transitions(db, task_id)
    assert len(facts) == 8

    lines = assert_fits(await arun_cli(db_url, "task", "history", task_id, env=NARROW))
    assert len(lines) == 2 + 8  # the header, its rule and one line a transition
    assert lines[0].split()[:4] == ["time", "(UTC)", "transition", "reason"]
    assert re.match(r"\d\d:\d\d:\d\d  ", lines[2])  # one day: the time alone
    body = lines[2:]
    assert [line.split()[1:4] for line in body[:3]] == [
        ["queued", "->", "running"],
        ["running", "->", "retry_wait"],
        ["retry_wait", "->", "queued"],
    ]
    assert "running -> failed" in body[-1] and "attempt_ceiling" in body[-1]
    assert "attempt 1 of 3" in body[1]  # the summary, on its line


async def test_task_list_at_80_columns_shows_full_status_attempts_and_reason(
    db: StateDB, db_url: str
) -> None:
    failed = await failed_three_times(db)
    parent = await submit(db, "picky", {"error": "KeyError"})
    waiting = await submit(db, "picky", {"error": "KeyError"}, depends_on=[parent])
    cancelled = await submit(db, "picky", {"error": "KeyError"})
    await taskward.request_task_cancel(
        db,
        cancelled,
        actor=taskward.Actor(type="operator", id="ada"),
        idempotency_key="stop",
        reason="not needed any more",
    )

    lines = assert_fits(await arun_cli(db_url, "task", "list", env=NARROW))
    text = "\n".join(lines)

    def row_of(task_id: str) -> tuple[list[str], str]:
        i = next(i for i, line in enumerate(lines) if line.startswith(task_id))
        return lines[i].split(), lines[i + 1].strip()

    fields, reason = row_of(failed)
    assert fields[1:4] == ["failed", "picky", "3/3"]
    assert reason.startswith("attempt_ceiling")
    fields, reason = row_of(waiting)
    assert fields[1] == "waiting_dependency"  # the longest status, whole
    fields, reason = row_of(cancelled)
    assert fields[1] == "cancelled"
    assert "not needed any more" in reason
    assert "…" not in " ".join(line.split()[1] for line in lines[2::2])  # no status cut
    assert "compl…" not in text

    wide = await arun_cli(db_url, "task", "list", env={"COLUMNS": "200"})
    assert any("cancelled: not needed any more" in line for line in wide.stdout.splitlines())


async def test_task_show_is_one_line_a_field_within_80_columns(db: StateDB, db_url: str) -> None:
    long_text = "word " * 60
    task_id = await submit(db, "agent", {"objective": long_text.strip()})
    lines = assert_fits(await arun_cli(db_url, "task", "show", task_id, env=NARROW))
    assert all(line.strip() for line in lines)  # not double-spaced
    assert all(line == line.rstrip() for line in lines)  # nothing padded to the edge
    assert lines[0].split() == ["id", task_id]
    named = {line.split()[0] for line in lines if not line.startswith(" ")}
    assert {"id", "status", "action_kind", "action_args", "created_at"} <= named
    assert sum("word" in line for line in lines) >= 4  # the long arg wraps, whole
    assert sum(line.count("word") for line in lines) == 60


async def test_history_shows_who_asked_for_a_cancel_and_why(db: StateDB, db_url: str) -> None:
    queued = await submit(db, "picky", {"error": "KeyError"})
    running = await submit(db, "picky", {"error": "KeyError"})
    worker = WorkerSpec(worker_id="host:holder", kinds=REGISTRY.kinds())
    [lease] = await claim_runs(db, worker, limit=1, now=T0)
    if lease.task_id != running:
        queued, running = running, queued

    for task_id in (queued, running):
        cancel = await arun_cli(db_url, "task", "cancel", task_id, "--reason", "wrong input")
        assert cancel.code == EXIT_OK, cancel.stderr
        assert "generated idempotency key" not in cancel.stderr  # only admission announces

    lines = assert_fits(await arun_cli(db_url, "task", "history", running, env=NARROW))
    line = next(line for line in lines if "cancel requested" in line)
    assert "wrong input" in line and "operator:" in line
    history = (await arun_cli(db_url, "task", "history", running, "--json")).json()
    [request] = history["cancel_requests"]
    assert request["reason"] == "wrong input" and request["actor"].startswith("operator:")

    history = (await arun_cli(db_url, "task", "history", queued, env=NARROW)).stdout
    assert "queued -> cancelled" in history and "wrong input" in history


async def test_task_wait_on_a_failure_prints_its_reason_and_output_tail(
    db: StateDB, db_url: str
) -> None:
    script = "for i in $(seq 1 30); do echo line $i; done; echo oops >&2; exit 3"
    task_id = await submit(db, "command", {"argv": ["sh", "-c", script]}, max_attempts=1)
    await run_at(db, T0)

    waited = await arun_cli(db_url, "task", "wait", task_id)
    assert waited.code == EXIT_FAILURE
    assert waited.stdout.strip() == "failed"  # stdout stays the status alone, for scripts
    err = waited.stderr
    assert re.search(r"reason: \w+", err), err
    assert "exit code: 3" in err
    assert "  line 30\n  oops" in err and "  line 12\n" in err  # the last 20 lines of output
    assert "  line 11\n" not in err

    short = await arun_cli(db_url, "task", "wait", task_id, "--tail", "2")
    assert "line 30\n  oops" in short.stderr and "line 29\n" not in short.stderr

    as_json = (await arun_cli(db_url, "task", "wait", task_id, "--json")).json()
    assert as_json["status"] == "failed" and as_json["reason_code"]
    assert as_json["output_tail"].splitlines()[-1] in {"line 30", "oops"}

    result = await arun_cli(db_url, "task", "wait", task_id, "--result")
    assert (result.code, result.stdout.strip()) == (EXIT_FAILURE, "failed")


async def test_args_come_from_a_file_or_stdin_within_a_bound(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    big = {"objective": "x" * 300_000}  # over what a command line takes comfortably
    path = tmp_path / "args.json"
    path.write_text(json.dumps(big, indent=2))
    from_file = await arun_cli(db_url, "task", "submit", "agent", "--args", f"@{path}", "--json")
    assert from_file.code == EXIT_OK, from_file.stderr
    row = await taskward.get_task(db, from_file.json()["task_id"])
    assert row["action_args"] == big

    piped = await arun_cli(
        db_url, "task", "submit", "agent", "--args", "-", "--json", input='{"objective": "in"}'
    )
    assert piped.code == EXIT_OK, piped.stderr
    assert (await taskward.get_task(db, piped.json()["task_id"]))["action_args"] == {
        "objective": "in"
    }

    missing = await arun_cli(db_url, "task", "submit", "agent", "--args", "@nope.json")
    assert missing.code == EXIT_BAD_INPUT
    assert "--args @nope.json: cannot read nope.json" in missing.stderr

    path.write_text("[1]")
    not_object = await arun_cli(db_url, "task", "submit", "agent", "--args", f"@{path}")
    assert not_object.code == EXIT_BAD_INPUT
    assert f"--args (@{path}) must be a JSON object" in not_object.stderr

    path.write_bytes(b"{" + b" " * MAX_ARGS_TEXT_BYTES + b"}")
    too_big = await arun_cli(db_url, "task", "submit", "agent", "--args", f"@{path}")
    assert too_big.code == EXIT_BAD_INPUT
    assert f"larger than {MAX_ARGS_TEXT_BYTES} bytes" in too_big.stderr
    assert "Traceback" not in too_big.stderr
    assert (await taskward.list_tasks(db))[0].__len__() == 2  # nothing else admitted


async def test_version_and_json_on_every_listing(db: StateDB, db_url: str) -> None:
    shown = await arun_cli(db_url, "--version")
    assert (shown.code, shown.stdout.strip()) == (EXIT_OK, f"taskward {version('taskward')}")

    task_id = await submit(db, "picky", {"error": "KeyError"})
    for argv in (
        ["task", "list"],
        ["task", "show", task_id],
        ["task", "history", task_id],
        ["task", "tree", task_id],
        ["schedule", "list"],
        ["outbox", "list"],
        ["limit", "list"],
        ["kinds"],
    ):
        run = await arun_cli(db_url, *argv, "--json")
        assert run.code == EXIT_OK, (argv, run.stderr)
        assert isinstance(run.json(), dict | list), argv


def test_taskward_up_prints_a_line_per_task_state_change() -> None:
    from datetime import UTC, datetime, timedelta

    from taskward.host.models import Task

    later = datetime.now(UTC) + timedelta(minutes=5)
    task = Task(
        id="01a2458b-274b-7f1f-bc43-11ecd0f85693",
        objective="send_report x",
        cwd=Path("."),
        lease_id="w/1",
        lease_expires_at=later,
        attempt=1,
        deadline=later,
    )
    lines: list[str] = []
    hook = TaskLines(lambda task_id: "send_report", echo=lines.append, clock=lambda: 0.0)

    class Failure:
        code = "flow_failed"
        detail = "exit code 3\nline 1\nline 2"

    hook("start", task, {})
    hook("end", task, {"outcome": "completed"})
    hook("start", task, {})
    hook("end", task, {"outcome": "failed", "failure": Failure()})
    stamp = r"\d\d:\d\d:\d\d"
    assert re.fullmatch(rf"{stamp} running   send_report {task.id} attempt 1", lines[0])
    assert re.fullmatch(rf"{stamp} completed send_report {task.id} \d+\.\ds", lines[1])
    assert re.fullmatch(
        rf"{stamp} failed    send_report {task.id} \d+\.\ds flow_failed: exit code 3", lines[3]
    )
    assert all(len(line) <= 120 for line in lines)


@pytest.mark.parametrize("width", [80, 120])
async def test_listings_of_schedules_and_outbox_fit(db: StateDB, db_url: str, width: int) -> None:
    await create_schedule(
        db,
        name="a-rather-long-schedule-name-for-reports",
        action_kind="picky",
        args={"error": "KeyError"},
        cron="0 2 * * *",
        timezone="Europe/Berlin",
        registry=REGISTRY,
    )
    for argv in (["schedule", "list"], ["outbox", "list"]):
        assert_fits(await arun_cli(db_url, *argv, env={"COLUMNS": str(width)}), width)
