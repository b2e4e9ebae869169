"""Launcher kinds (agent, flow, fanout, play, flow_yaml, engine): run ``<launcher> KIND ...``.

The launcher (``TASKWARD_LAUNCHER``, default ``li``) is run as an argv list, never through a
shell, and a bare launcher name is resolved on the worker's own PATH. Arguments are built from
``args``: every key but ``argv``, ``cwd``, ``env`` and ``timeout_s`` becomes ``--key=value`` in
sorted key order (``_`` in a key becomes ``-``; ``true`` is a bare ``--key``; ``false`` and
``null`` are left out; a list repeats the flag per item), then ``args.argv`` (a list of strings)
is appended as is. ``--key=value`` keeps a value that starts with ``-`` a value. ``cwd``, ``env``
and ``timeout_s`` apply to the launcher process as they do for ``command``; like a command,
the launcher gets the minimal child environment (``childenv.child_environment``), not the
worker's: a launcher that needs a setting gets it through ``TASKWARD_CHILD_ENV_PASSTHROUGH``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from taskward.adapters.childenv import validate_env_passthrough
from taskward.adapters.process import (
    KILL_GRACE_S,
    run_process,
    task_args,
    validate_argv,
    validate_process_args,
)
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult

LAUNCHER_KINDS: Final[tuple[str, ...]] = ("agent", "flow", "fanout", "play", "flow_yaml", "engine")
DEFAULT_LAUNCHER: Final = "li"
_RESERVED: Final = frozenset({"argv", "cwd", "env", "timeout_s"})
_KEY: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_SCALARS = "a string, number, boolean, null or a list of strings and numbers"


def _text(value: str | int | float) -> str:
    return value if isinstance(value, str) else repr(value)


def launcher_argv(launcher: str, kind: str, args: Mapping[str, Any]) -> list[str]:
    """``[launcher, kind, --key=value..., *args.argv]`` for args that passed ``validate_args``."""
    argv = [launcher, kind]
    for key in sorted(k for k in args if k not in _RESERVED):
        flag = "--" + key.replace("_", "-")
        value = args[key]
        for item in value if isinstance(value, list) else [value]:
            if item is True:
                argv.append(flag)
            elif item is not False and item is not None:
                argv.append(f"{flag}={_text(item)}")
    argv += list(args.get("argv") or [])
    return argv


def _check_value(key: str, value: object) -> None:
    items = value if isinstance(value, list) else [value]
    for item in items:
        scalar = item is None or isinstance(item, str | int | float)
        if not scalar or (isinstance(value, list) and (item is None or isinstance(item, bool))):
            raise TaskValidationError(f"args.{key}", value, _SCALARS)
        if isinstance(item, str) and "\0" in item:
            raise TaskValidationError(f"args.{key}", item, "a string without NUL characters")


class LauncherAdapter:
    """One launcher kind: ``<launcher> <kind> --key=value... argv...``."""

    def __init__(
        self,
        action_kind: str,
        *,
        launcher: str = DEFAULT_LAUNCHER,
        kill_grace_s: float = KILL_GRACE_S,
        env_passthrough: Iterable[str] = (),
    ) -> None:
        if not isinstance(launcher, str) or not launcher.strip() or "\0" in launcher:
            raise TaskValidationError("launcher", launcher, "an executable name or path")
        self.action_kind = action_kind
        self.launcher = launcher
        self.kill_grace_s = kill_grace_s
        self.env_passthrough = validate_env_passthrough(env_passthrough)

    def argv(self, args: Mapping[str, Any]) -> list[str]:
        return launcher_argv(self.launcher, self.action_kind, args)

    def validate_args(self, args: dict[str, Any]) -> None:
        validate_argv("args.argv", args.get("argv", []), require_program=False)
        for key, value in args.items():
            if key in _RESERVED:
                continue
            if not _KEY.match(key):
                raise TaskValidationError(
                    "args",
                    key,
                    "keys of letters, digits, '_' and '-' starting with a letter",
                    message=(
                        f"args key {key!r} cannot become a launcher flag; allowed: keys of "
                        "letters, digits, '_' and '-' starting with a letter"
                    ),
                )
            _check_value(key, value)
        validate_process_args(args)

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        try:
            args = task_args(task)
            self.validate_args(args)
        except TaskValidationError as exc:
            return TaskExecutionResult(
                status="failed", error_detail=f"rejected by the {self.action_kind} adapter: {exc}"
            )
        return await run_process(
            self.argv(args),
            cwd=args.get("cwd"),
            env=args.get("env"),
            timeout_s=args.get("timeout_s"),
            cancellation=cancellation,
            kill_grace_s=self.kill_grace_s,
            env_passthrough=self.env_passthrough,
        )
