"""What a task's process sees of the worker's environment (issue 23's first finding).

A child (a ``command`` or launcher task, a workflow step, the outbox's notify command) never
inherits the worker's environment: its output is stored and shown to every reader, and the
worker's environment holds taskward's own settings and secrets (``TASKWARD_API_TOKENS``). It gets
``child_environment``: a few basics, what the deployment passes through by name
(``TASKWARD_CHILD_ENV_PASSTHROUGH``), and the task's own ``env``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

from taskward.errors import TaskValidationError

# What a child process may see of the worker's environment (child_environment).
ENV_CHILD_ENV_PASSTHROUGH: Final = "TASKWARD_CHILD_ENV_PASSTHROUGH"
CHILD_ENV_BASICS: Final = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"}
)
CHILD_ENV_BASIC_PREFIXES: Final = ("LC_",)
# taskward's own settings: a pattern never matches them; only a name given in full passes one.
_OWN_PREFIX: Final = "TASKWARD_"
# Secrets that never reach a child, not even named in the passthrough (refused at start-up).
NEVER_PASSED: Final = frozenset(
    {
        "TASKWARD_API_TOKENS",
        "TASKWARD_API_TOKENS_FILE",
        "TASKWARD_SESSION_SECRET",
        "TASKWARD_WEBHOOK_SECRET",
    }
)
_PASSTHROUGH_ENTRY: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")
_PASSTHROUGH_ALLOWED: Final = (
    "comma-separated variable names, or a prefix ending in '*' (AWS_*); "
    "not '*' alone, no TASKWARD_* pattern, never " + ", ".join(sorted(NEVER_PASSED))
)


def validate_env_passthrough(
    entries: Iterable[str], *, field: str = ENV_CHILD_ENV_PASSTHROUGH
) -> tuple[str, ...]:
    """Check the names and ``PREFIX*`` patterns a deployment passes through to children.

    Raises:
        TaskValidationError: an entry is no variable name or prefix pattern (``*`` alone would
            pass everything), a pattern over taskward's own settings (``TASKWARD_*``: name them
            one by one), or one of the secrets of NEVER_PASSED.
    """
    if isinstance(entries, str):
        raise TypeError("entries must be an iterable of names, not one string")
    checked = tuple(entries)
    for entry in checked:
        if (
            not isinstance(entry, str)
            or not _PASSTHROUGH_ENTRY.match(entry)
            or entry in NEVER_PASSED
            or (entry.endswith("*") and entry.startswith(_OWN_PREFIX))
        ):
            raise TaskValidationError(field, entry, _PASSTHROUGH_ALLOWED)
    return checked


def parse_env_passthrough(value: str | None) -> tuple[str, ...]:
    """``TASKWARD_CHILD_ENV_PASSTHROUGH``'s text (comma- or semicolon-separated), checked."""
    items = (p.strip() for p in (value or "").replace(";", ",").split(","))
    return validate_env_passthrough(p for p in items if p)


def _passes(name: str, passthrough: tuple[str, ...]) -> bool:
    if name in NEVER_PASSED:
        return False
    if name in CHILD_ENV_BASICS or name.startswith(CHILD_ENV_BASIC_PREFIXES):
        return not name.startswith(_OWN_PREFIX)
    for entry in passthrough:
        if entry.endswith("*"):
            if name.startswith(entry[:-1]) and not name.startswith(_OWN_PREFIX):
                return True
        elif name == entry:
            return True
    return False


def child_environment(
    task_env: Mapping[str, str] | None = None,
    passthrough: Iterable[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of a child process (a task's, a workflow step's, a notify command).

    From the worker's environment (``environ``, default ``os.environ``) only CHILD_ENV_BASICS,
    ``LC_*`` and what ``passthrough`` names (exact names, or ``PREFIX*`` patterns) are copied;
    then ``task_env`` is laid over them. Invariant: nothing else of the worker's reaches a child
    -- a pattern never matches a ``TASKWARD_*`` setting, and NEVER_PASSED (the API tokens, the
    session and webhook secrets) is dropped even when named, since the child's output is shown
    to every reader. ``task_env`` is the submitter's own and is used as given.
    """
    source = os.environ if environ is None else environ
    entries = tuple(passthrough)
    env = {name: value for name, value in source.items() if _passes(name, entries)}
    if task_env:
        env.update(task_env)
    return env
