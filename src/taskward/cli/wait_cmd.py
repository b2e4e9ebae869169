"""``taskward task wait``: follow a task to its end (``--result``: the completed task's stored
result, R22; a task that ended otherwise: its reason and the tail of its output)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import click

from taskward import StateDB, get_task, get_task_result, list_transitions, open_db
from taskward.cli.common import CliState, json_option, pass_state
from taskward.lifecycle import TERMINAL

# Output lines shown of a task that did not complete (``--tail``'s default).
DEFAULT_TAIL_LINES: Final = 20
MAX_TAIL_LINES: Final = 1000


def output_tail(row: Mapping[str, Any]) -> str:
    """What the task printed last: its process evidence's ``output_tail``, else the lines of
    ``error_detail`` after its first (the first is the error itself, ``exit code 3``)."""
    for ref in row.get("status_evidence_refs") or ():
        tail = ref.get("output_tail") if isinstance(ref, Mapping) else None
        if isinstance(tail, str) and tail.strip():
            return tail
    detail = str(row.get("error_detail") or "")
    _, _, rest = detail.partition("\n")
    return rest


def failure_lines(row: Mapping[str, Any], *, tail: int) -> list[str]:
    """Why a task did not complete: its reason, its error's first line and the last ``tail``
    lines of its output."""
    code = row.get("status_reason_code") or "-"
    error = str(row.get("error_detail") or "").strip().partition("\n")[0]
    summary = str(row.get("status_reason_summary") or "").strip().partition("\n")[0]
    lines = [f"reason: {code}" + (f": {summary}" if summary else "")]
    if error and error not in summary:
        lines.append(f"error:  {error}")
    if row.get("exit_code") is not None:
        lines.append(f"exit code: {row['exit_code']}")
    output = output_tail(row).rstrip("\n").splitlines()
    if output and tail > 0:
        shown = output[-tail:]
        more = f"last {len(shown)} of {len(output)} lines" if len(shown) < len(output) else ""
        lines.append(f"output{f' ({more})' if more else ''}:")
        lines += [f"  {line}" for line in shown]
    return lines


def _answer(
    row: Mapping[str, Any], *, timed_out: bool, tail: int, result: tuple[bool, Any]
) -> dict[str, Any]:
    answer = {
        "task_id": row["id"],
        "status": row["status"],
        "timed_out": timed_out,
        "exit_code": row["exit_code"],
        "error_detail": row["error_detail"],
        "reason_code": row.get("status_reason_code"),
        "reason_summary": row.get("status_reason_summary"),
        "output_tail": "\n".join(output_tail(row).rstrip("\n").splitlines()[-tail:])
        if tail > 0
        else "",
    }
    if result[0]:
        answer["result"] = result[1]
    return answer


@click.command("wait")
@click.argument("task_id", metavar="ID")
@click.option("--timeout", type=click.FloatRange(min=0.0), help="Give up after this many seconds.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=0.25,
    show_default=True,
    help="Seconds between looks at the store.",
)
@click.option(
    "--result",
    "show_result",
    is_flag=True,
    help="On completion print the task's stored result as JSON on stdout (R22; the status "
    "line goes to stderr).",
)
@click.option(
    "--tail",
    type=click.IntRange(0, MAX_TAIL_LINES),
    default=DEFAULT_TAIL_LINES,
    show_default=True,
    help="Lines of a failed task's output shown (on stderr).",
)
@json_option
@pass_state
def task_wait(
    state: CliState,
    task_id: str,
    timeout: float | None,
    interval: float,
    show_result: bool,
    tail: int,
) -> int:
    """Follow a task to its end; exit 0 if it completed, 1 otherwise (or on --timeout).

    stdout is the final status alone. A task that ended otherwise also shows, on stderr, its
    reason, error and the last --tail lines of its output. With --result, a completed task's
    return value (its stored JSON; null when it returned nothing) is printed on stdout, ready
    for a pipe."""
    out = state.output

    async def follow(db: StateDB) -> tuple[dict[str, Any], bool]:
        deadline = None if timeout is None else time.monotonic() + timeout
        printed = 0
        status_line = None
        if not out.is_json and sys.stderr.isatty():
            from rich.console import Console

            status_line = Console(stderr=True).status(f"waiting for {task_id}")
            status_line.start()
        try:
            while True:
                row = await get_task(db, task_id)
                if not out.is_json:
                    facts: Sequence[Mapping[str, Any]] = (
                        await list_transitions(db, task_id)
                        if row["status"] != "queued" or printed
                        else []
                    )
                    for fact in facts[printed:]:
                        click.echo(
                            f"{fact['previous_status']} -> {fact['status']} "
                            f"({fact['reason_code']})",
                            err=True,
                        )
                    printed = max(printed, len(facts))
                    if status_line is not None:
                        status_line.update(f"waiting for {task_id}: {row['status']}")
                if row["status"] in TERMINAL:
                    return row, False
                if deadline is not None and time.monotonic() >= deadline:
                    return row, True
                await asyncio.sleep(interval)
        finally:
            if status_line is not None:
                status_line.stop()

    async def run() -> tuple[dict[str, Any], bool, Any]:
        async with open_db(state.db_url) as db:
            row, timed_out = await follow(db)
            completed = row["status"] == "completed"
            value = await get_task_result(db, task_id) if show_result and completed else None
            return row, timed_out, value

    row, timed_out, value = asyncio.run(run())
    completed = row["status"] == "completed"
    if out.is_json:
        out.json(_answer(row, timed_out=timed_out, tail=tail, result=(show_result, value)))
    elif show_result and completed:
        click.echo(row["status"], err=True)
        out.line(json.dumps(value, indent=2, ensure_ascii=False))
    else:
        suffix = " (still running: --timeout reached)" if timed_out else ""
        out.line(f"{row['status']}{suffix}")
        if row["status"] in TERMINAL and not completed:
            for line in failure_lines(row, tail=tail):
                click.echo(line, err=True)
    return 0 if completed else 1
