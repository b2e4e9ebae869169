"""``taskward`` commands: parse, call the async library once with ``asyncio.run``, render.

No SQL and no dialect here; errors become exit codes in ``taskward.cli.errors`` only.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from typing import Any

import click

from taskward import (
    StateDB,
    Status,
    TaskApplication,
    get_task,
    list_task_events,
    list_tasks,
    list_transitions,
    request_task_cancel,
    submit_task,
)
from taskward.admission import validate_application
from taskward.cancellation import validate_cancel_request
from taskward.cli.common import (
    CliState,
    LazyGroup,
    generated_key,
    json_option,
    operator,
    parse_args,
    parse_duration,
    parse_time,
    pass_state,
    registry_for,
    split_ids,
    template_options,
    with_db,
)
from taskward.cli.errors import EXIT_OK, report
from taskward.cli.output import cancel_requests
from taskward.cli.retention_cmd import archive, prune
from taskward.cli.tree_cmd import task_tree
from taskward.cli.wait_cmd import task_wait
from taskward.cli.worker_cmd import worker
from taskward.cli.workers_cmd import worker_list, worker_prune
from taskward.fields import run_after_for_delay
from taskward.models import EXECUTION_TARGETS, check_key
from taskward.placement import placement_reason
from taskward.reads import MAX_LIST_LIMIT
from taskward.registry import DEFAULT_ALIASES
from taskward.resubmit import retry_task
from taskward.store.open import DEFAULT_URL, ENV_VAR

DEFAULT_LIST_LIMIT = 20


@click.group(
    cls=LazyGroup,
    lazy_subcommands={
        "serve": "taskward.cli.serve_cmd:serve",
        "up": "taskward.cli.serve_cmd:up",
        "schedule": "taskward.cli.schedule_cmd:schedule",
        "outbox": "taskward.cli.outbox_cmd:outbox",
        "limit": "taskward.cli.limit_cmd:limit",
        "pause": "taskward.cli.limit_cmd:pause",
        "resume": "taskward.cli.limit_cmd:resume",
        "kinds": "taskward.cli.kinds_cmd:kinds",
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="taskward", prog_name="taskward", message="%(prog)s %(version)s")
@click.option(
    "--db",
    "db_url",
    default=DEFAULT_URL,
    envvar=ENV_VAR,
    show_default=True,
    show_envvar=True,
    metavar="URL",
    help="Store URL: sqlite:///path.db or postgresql://user@host:port/dbname.",
)
@click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE to register its @taskward.task functions (repeatable; adds to "
    "TASKWARD_IMPORTS).",
)
@pass_state
def cli(state: CliState, db_url: str, imports: tuple[str, ...]) -> None:
    """taskward: a durable task queue."""
    state.db_url = db_url
    state.imports = imports


@cli.command()
@json_option
@pass_state
def migrate(state: CliState) -> None:
    """Apply pending schema migrations; a second run is a no-op."""
    sep = "&" if "?" in state.db_url else "?"
    url = f"{state.db_url}{sep}migrate=false"  # open without migrating, so we see what applies

    async def work(db: StateDB) -> list[str]:
        return await db.migrate()

    applied = with_db(url, work)
    out = state.output
    if out.is_json:
        out.json({"applied": applied})
    elif applied:
        for name in applied:
            out.line(f"applied {name}")
    else:
        out.line("up to date")


@cli.group()
def task() -> None:
    """Submit, inspect and cancel tasks."""


@task.command("submit")
@click.argument("kind")
@template_options
@click.option(
    "--key",
    help="Idempotency key; resubmitting with the same key is safe. "
    "Generated and printed when omitted.",
)
@click.option(
    "--run-after",
    metavar="TIME",
    help="Not before TIME: ISO 8601 (2026-12-24T18:00:00Z; no zone: UTC) or epoch seconds.",
)
@click.option(
    "--delay",
    metavar="DURATION",
    help="Not before now + DURATION (30s, 5m, 2h, 1d). A retry with the same --key keeps "
    "the first try's time.",
)
@click.option("--priority", type=int, default=0, show_default=True, help="-100..100, higher first.")
@click.option(
    "--max-attempts",
    type=int,
    metavar="N",
    help="This task's attempt ceiling, 1..100 (default: its kind's, else the queue's).",
)
@click.option("--limit-key", metavar="KEY", help="A limit key, e.g. tenant:acme (taskward limit).")
@click.option(
    "--depends-on",
    "depends_on",
    multiple=True,
    metavar="ID",
    help="Run only after task ID completes (repeatable, or comma-separated ids); "
    "see: taskward task tree.",
)
@json_option
@pass_state
def task_submit(
    state: CliState,
    kind: str,
    args_text: str,
    target: str,
    capabilities: tuple[str, ...],
    key: str | None,
    library_ref: str | None,
    library_hash: str | None,
    run_after: str | None,
    delay: str | None,
    priority: int,
    max_attempts: int | None,
    limit_key: str | None,
    depends_on: tuple[str, ...],
) -> None:
    """Submit a task of action KIND and print its id."""
    out = state.output
    args = parse_args(args_text)
    registry = registry_for(state)
    generated = key is None
    if run_after is not None and delay is not None:
        raise click.UsageError("give --run-after or --delay, not both")
    delay_s = parse_duration("--delay", delay) if delay is not None else None
    # ADR-0072 D1: the CLI generates a key only when the caller omits one.
    app = TaskApplication(
        action_kind=kind,
        args=args,
        execution_target=target,
        idempotency_key=generated_key() if key is None else key,
        required_capabilities=list(capabilities),
        library_ref=library_ref,
        library_content_hash=library_hash,
        run_after=parse_time("--run-after", run_after) if run_after is not None else None,
        priority=priority,
        max_attempts=max_attempts,
        limit_key=limit_key,
        depends_on=split_ids(depends_on),
    )
    validate_application(app, registry)  # bad input exits 2 before a key is announced
    if generated:
        # Announced before the store is touched: a caller who never sees the answer (a lost
        # connection, a crash) can still retry safely with this key.
        out.notice(
            f"generated idempotency key {app.idempotency_key}; to retry this submission "
            f"safely, pass --key {app.idempotency_key}"
        )

    async def work(db: StateDB) -> str:
        submitted = app
        if delay_s is not None:  # R16: resolved against the key, so a retry replays
            at = await run_after_for_delay(db, app.idempotency_key, delay_s)
            submitted = dataclasses.replace(app, run_after=at)
        return await submit_task(db, submitted, registry=registry, admission_source="cli")

    task_id = with_db(state.db_url, work)
    if out.is_json:
        out.json(
            {"task_id": task_id, "idempotency_key": app.idempotency_key, "key_generated": generated}
        )
    else:
        out.line(task_id)


@task.command("show")
@click.argument("task_id", metavar="ID")
@json_option
@pass_state
def task_show(state: CliState, task_id: str) -> None:
    """Show one task's row (and, while it is queued, why it is not running yet)."""

    async def work(db: StateDB) -> tuple[dict[str, Any], dict[str, Any] | None]:
        row = await get_task(db, task_id)
        placement = await placement_reason(db, task_id) if row["status"] == "queued" else None
        return row, placement

    row, placement = with_db(state.db_url, work)
    if state.output.is_json:
        state.output.json({**row, "placement": placement} if placement else row)
    else:
        state.output.task(row)
        if placement is not None:
            state.output.line(f"placement: {placement['reason']}")


@task.command("list")
@click.option("--status", type=click.Choice([s.value for s in Status]), help="Only this status.")
@click.option("--kind", help="Only this action kind.")
@click.option("--target", type=click.Choice(sorted(EXECUTION_TARGETS)), help="Only this target.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIST_LIMIT),
    default=DEFAULT_LIST_LIMIT,
    show_default=True,
    help="Page size.",
)
@click.option("--cursor", help="Continue after a previous page.")
@json_option
@pass_state
def task_list(
    state: CliState,
    status: str | None,
    kind: str | None,
    target: str | None,
    limit: int,
    cursor: str | None,
) -> None:
    """List tasks, newest first."""
    if kind is not None:
        kind = DEFAULT_ALIASES.get(kind, kind)  # stored kinds are canonical (R8)
    rows, next_cursor = with_db(
        state.db_url,
        lambda db: list_tasks(
            db, status=status, action_kind=kind, execution_target=target, limit=limit, cursor=cursor
        ),
    )
    if state.output.is_json:
        state.output.json({"tasks": rows, "next_cursor": next_cursor})
    else:
        state.output.tasks(rows, next_cursor)


@task.command("history")
@click.argument("task_id", metavar="ID")
@json_option
@pass_state
def task_history(state: CliState, task_id: str) -> None:
    """Show a task's status transitions, oldest first, and the cancel requests among them
    (with their reason and who asked)."""

    async def work(db: StateDB) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        facts = await list_transitions(db, task_id)
        return facts, cancel_requests(await list_task_events(db, task_id))

    facts, cancels = with_db(state.db_url, work)
    if state.output.is_json:
        state.output.json({"task_id": task_id, "transitions": facts, "cancel_requests": cancels})
    else:
        state.output.transitions(facts, cancels)


@task.command("cancel")
@click.argument("task_id", metavar="ID")
@click.option("--key", help="Idempotency key of this request; generated when omitted.")
@click.option("--reason", default="", help="Why; recorded on the transition.")
@json_option
@pass_state
def task_cancel(state: CliState, task_id: str, key: str | None, reason: str) -> None:
    """Cancel a task: at once when no worker holds it, else ask its worker to stop."""
    out = state.output
    # No notice for a generated key: repeating a cancel is harmless (a second request of a
    # cancelled task answers already_terminal), so only admission announces its key.
    key = generated_key() if key is None else key
    validate_cancel_request(key, reason)
    actor = operator()
    result = with_db(
        state.db_url,
        lambda db: request_task_cancel(
            db, task_id, actor=actor, idempotency_key=key, reason=reason
        ),
    )
    if out.is_json:
        out.json({**result.model_dump(), "idempotency_key": key})
        return
    out.line(f"{result.state} (status: {result.current_status})")
    if result.state == "cancellation_requested":
        out.notice(
            "the worker holding the task stops it cooperatively; "
            f"watch with: taskward task history {task_id}"
        )


@task.command("retry")
@click.argument("task_id", metavar="ID")
@click.option("--key", help="Idempotency key of this retry; generated when omitted.")
@json_option
@pass_state
def task_retry(state: CliState, task_id: str, key: str | None) -> None:
    """Run an ended task again as a new task (DESIGN.md R19); the original never changes.

    The same --key returns the same new task, so a retry is safe to repeat.
    """
    out = state.output
    generated = key is None
    key = generated_key() if key is None else key
    check_key("idempotency_key", key)  # bad input exits 2 before a key is announced
    if generated:
        out.notice(
            f"generated idempotency key {key}; to repeat this retry safely, pass --key {key}"
        )
    actor = operator()
    registry = registry_for(state)
    new_id = with_db(
        state.db_url,
        lambda db: retry_task(db, task_id, actor=actor, idempotency_key=key, registry=registry),
    )
    if out.is_json:
        out.json({"task_id": new_id, "retry_of": task_id, "idempotency_key": key})
        return
    out.line(new_id)
    out.notice(f"task {new_id} retries {task_id}; watch with: taskward task wait {new_id}")


cli.add_command(worker)
worker.add_command(worker_list)
worker.add_command(worker_prune)
cli.add_command(prune)
cli.add_command(archive)
task.add_command(task_wait)
task.add_command(task_tree)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see ``taskward.cli.errors.EXIT_CODES``)."""
    state = CliState()
    # The pool logs every failed connection attempt; the CLI reports a store failure once, as
    # one line, through its exit-code table instead.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    try:
        rv = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="taskward",
            standalone_mode=False,
            obj=state,
        )
    except (Exception, KeyboardInterrupt) as exc:
        return report(exc, as_json=state.output.is_json)
    return rv if isinstance(rv, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
