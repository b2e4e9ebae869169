"""Launcher kinds (agent, flow, fanout, play, flow_yaml, engine): run ``<launcher> KIND ...``.

The launcher (``TASKWARD_LAUNCHER``, default ``li``) is run as an argv list, never through a
shell. Arguments are built from ``args``: ``args.argv`` (a list of strings) is appended as is;
every other scalar key becomes ``--key value`` in sorted order.
"""

from __future__ import annotations

from typing import Any, Final

from taskward.adapters.process import run_process
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult

LAUNCHER_KINDS: Final[tuple[str, ...]] = ("agent", "flow", "fanout", "play", "flow_yaml", "engine")
_RESERVED: Final = frozenset({"argv", "cwd", "env", "timeout_s", "objective"})


def launcher_argv(launcher: str, kind: str, args: dict[str, Any]) -> list[str]:
    argv = [launcher, kind]
    for key in sorted(k for k in args if k not in _RESERVED):
        value = args[key]
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    if "objective" in args:
        argv += ["--objective", str(args["objective"])]
    argv += list(args.get("argv", []))
    return argv


class LauncherAdapter:
    def __init__(self, action_kind: str, *, launcher: str = "li") -> None:
        self.action_kind = action_kind
        self.launcher = launcher

    def validate_args(self, args: dict[str, Any]) -> None:
        argv = args.get("argv", [])
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise TaskValidationError("args.argv", argv, "a list of strings")
        for key, value in args.items():
            if key not in _RESERVED and not isinstance(value, str | int | float | bool | None):
                raise TaskValidationError(f"args.{key}", value,
                                          "a string, number, boolean or null")
        timeout = args.get("timeout_s")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
            raise TaskValidationError("args.timeout_s", timeout, "a positive number of seconds")

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        args = task.get("action_args") or {}
        return await run_process(
            launcher_argv(self.launcher, self.action_kind, args),
            cwd=args.get("cwd"),
            env=args.get("env"),
            timeout_s=args.get("timeout_s"),
            cancellation=cancellation,
        )
