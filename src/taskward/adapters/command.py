"""``command``: run an argv list as a subprocess, never through a shell.

Only executables on the deployment's allowlist run (otherwise anyone allowed to submit could run
anything); ``None`` allows any, which only ``taskward up``'s local default does, loudly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from taskward.adapters.process import run_process, validate_process_args
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult


class CommandAdapter:
    action_kind = "command"

    def __init__(self, *, allowlist: Iterable[str] | None = ()) -> None:
        self.allowlist = None if allowlist is None else frozenset(allowlist)

    def _allowed(self, executable: str) -> bool:
        if self.allowlist is None:
            return True
        return executable in self.allowlist or os.path.basename(executable) in self.allowlist

    def validate_args(self, args: dict[str, Any]) -> None:
        argv = args.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise TaskValidationError("args.argv", argv, "a non-empty list of strings")
        if not argv[0]:
            raise TaskValidationError("args.argv[0]", argv[0], "an executable name or path")
        if not self._allowed(argv[0]):
            allowed = sorted(self.allowlist or ())
            raise TaskValidationError(
                "args.argv[0]", argv[0],
                allowed or "nothing (set TASKWARD_COMMAND_ALLOWLIST)",
                message=(f"args.argv[0] {argv[0]!r} is not on the command allowlist; allowed: "
                         f"{', '.join(allowed) or 'none (set TASKWARD_COMMAND_ALLOWLIST)'}"),
            )
        validate_process_args(args)

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        args = task.get("action_args") or {}
        if not self._allowed(args["argv"][0]):
            return TaskExecutionResult(
                status="failed", exit_code=None,
                error_detail=f"{args['argv'][0]!r} is not on this worker's command allowlist")
        return await run_process(
            list(args["argv"]),
            cwd=args.get("cwd"),
            env=args.get("env"),
            timeout_s=args.get("timeout_s"),
            cancellation=cancellation,
        )
