"""``command``: run an argv list as a subprocess, never through a shell.

Only executables on the deployment's allowlist run (otherwise anyone allowed to submit could run
anything); ``None`` allows any, which only ``taskward up``'s local default does, loudly. An
allowlist entry matches ``argv[0]`` exactly: a bare name matches only that bare name (resolved on
the worker's own PATH, which the task's ``env`` cannot redirect), a path only that path. While an
allowlist is in force the task's ``env`` may not set dynamic-loader variables (``LD_*``).

The child sees only the minimal environment of ``childenv.child_environment`` (PATH, HOME, the
locale, ...), the names the deployment passes through (``TASKWARD_CHILD_ENV_PASSTHROUGH``) and
the task's ``env``: never the worker's tokens or other settings, since its output is evidence
that every reader sees.

The allowlist fences which program starts, not what it does with its arguments: do not list
programs that run other programs (``sh``, ``env``, ``python``) unless that is intended.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from taskward.adapters.childenv import validate_env_passthrough
from taskward.adapters.process import (
    KILL_GRACE_S,
    run_process,
    task_args,
    validate_argv,
    validate_memory_limit,
    validate_process_args,
)
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult

_NO_ALLOWLIST = "none (set TASKWARD_COMMAND_ALLOWLIST)"


class CommandAdapter:
    """``args``: ``argv`` (list of strings), optional ``cwd``, ``env``, ``timeout_s`` and
    ``memory_limit_mb`` (the child's address space, ``RLIMIT_AS``; going past it is a
    retryable failure)."""

    action_kind = "command"

    def __init__(
        self,
        *,
        allowlist: Iterable[str] | None = (),
        kill_grace_s: float = KILL_GRACE_S,
        env_passthrough: Iterable[str] = (),
    ) -> None:
        if isinstance(allowlist, str):
            raise TypeError("allowlist must be an iterable of executables, not one string")
        if allowlist is not None:
            for entry in allowlist:
                if (
                    not isinstance(entry, str)
                    or not entry
                    or (os.sep in entry and not os.path.isabs(entry))
                ):
                    raise TaskValidationError(
                        "command_allowlist", entry, "bare executable names or absolute paths"
                    )
        self.allowlist = None if allowlist is None else frozenset(allowlist)
        self.kill_grace_s = kill_grace_s
        self.env_passthrough = validate_env_passthrough(env_passthrough)

    def is_allowed(self, executable: str) -> bool:
        return self.allowlist is None or executable in self.allowlist

    def validate_args(self, args: dict[str, Any]) -> None:
        argv = validate_argv("args.argv", args.get("argv"), require_program=True)
        if not self.is_allowed(argv[0]):
            allowed = sorted(self.allowlist or ())
            allowed_text = ", ".join(allowed) or _NO_ALLOWLIST
            raise TaskValidationError(
                "args.argv[0]",
                argv[0],
                allowed or _NO_ALLOWLIST,
                message=(
                    f"args.argv[0] {argv[0]!r} is not on the command allowlist; "
                    f"allowed: {allowed_text}"
                ),
            )
        validate_process_args(args, allow_loader_env=self.allowlist is None)
        validate_memory_limit(args)

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        # Checked again here: this worker's allowlist may be narrower than the admitting one's.
        try:
            args = task_args(task)
            self.validate_args(args)
        except TaskValidationError as exc:
            return TaskExecutionResult(
                status="failed", error_detail=f"rejected by this worker's command adapter: {exc}"
            )
        return await run_process(
            list(args["argv"]),
            cwd=args.get("cwd"),
            env=args.get("env"),
            timeout_s=args.get("timeout_s"),
            cancellation=cancellation,
            kill_grace_s=self.kill_grace_s,
            memory_limit_mb=validate_memory_limit(args),
            env_passthrough=self.env_passthrough,
        )
