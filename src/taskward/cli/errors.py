"""The CLI's one table from exceptions to exit codes, and how an error is shown.

0 success; 2 bad input (nothing was written); 1 a conflict or a failure; 130 interrupted.
Expected errors print one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
import traceback
from typing import Any, Final

import click

from taskward.errors import (
    AdapterNotRegistered,
    StoreError,
    TaskIdempotencyConflict,
    TaskNotFound,
    TaskValidationError,
    TaskwardError,
    TransitionIdempotencyConflict,
)

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_BAD_INPUT: Final = 2
EXIT_INTERRUPTED: Final = 130

# The one mapping (STYLE.md section 4). First match wins, so subclasses come before their bases.
EXIT_CODES: Final[tuple[tuple[type[BaseException], int], ...]] = (
    # TaskValidationError covers AdapterNotRegistered, InvalidTransition and the CLI's own
    # input checks (invalid --args JSON, an unimportable --import module).
    (TaskValidationError, EXIT_BAD_INPUT),
    (click.UsageError, EXIT_BAD_INPUT),  # unknown option, missing argument, bad choice
    (TaskIdempotencyConflict, EXIT_FAILURE),  # the message names the existing task id
    (TransitionIdempotencyConflict, EXIT_FAILURE),
    (TaskNotFound, EXIT_FAILURE),
    (StoreError, EXIT_FAILURE),  # StoreUnavailable too
    (TaskwardError, EXIT_FAILURE),
    (click.Abort, EXIT_INTERRUPTED),
    (KeyboardInterrupt, EXIT_INTERRUPTED),
    (click.ClickException, EXIT_FAILURE),
)


def exit_code_for(exc: BaseException) -> int:
    """The exit code of ``exc``; anything not in the table is a failure (1)."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_FAILURE


def is_expected(exc: BaseException) -> bool:
    return any(isinstance(exc, kind) for kind, _ in EXIT_CODES)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def describe(exc: BaseException) -> dict[str, Any]:
    """A JSON-ready description of ``exc`` for ``--json`` mode."""
    out: dict[str, Any] = {"error": type(exc).__name__, "message": _one_line(str(exc))}
    if isinstance(exc, TaskValidationError):
        out.update(field=exc.field, allowed=exc.allowed)
    if isinstance(exc, AdapterNotRegistered):
        out.update(registered=exc.registered, aliases=exc.aliases)
    if isinstance(exc, TaskIdempotencyConflict):
        out.update(idempotency_key=exc.key, existing_task_id=exc.existing_task_id)
    if isinstance(exc, TaskNotFound):
        out.update(task_id=exc.task_id)
    return out


def report(exc: BaseException, *, as_json: bool) -> int:
    """Show ``exc`` on stderr and return its exit code."""
    code = exit_code_for(exc)
    if isinstance(exc, click.ClickException) and not as_json:
        exc.show()  # click's own format: usage, a hint and the "Error: ..." line
    elif isinstance(exc, click.Abort | KeyboardInterrupt):
        click.echo("Aborted!", err=True)
    elif as_json:
        click.echo(json.dumps(describe(exc), sort_keys=True), err=True)
    elif is_expected(exc):
        click.echo(f"taskward: error: {_one_line(str(exc))}", err=True)
    else:
        # Not an outcome the CLI expects: a bug or an environment failure. Keep the traceback
        # so it can be reported.
        traceback.print_exception(exc)
        click.echo(f"taskward: unexpected error: {type(exc).__name__}: {exc}", err=True)
    return code
