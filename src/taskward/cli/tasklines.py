"""Per-task lines of ``taskward up``: one line when a task starts and one when it ends.

    12:01:03 running   send_report 01a2458b-274b-7f1f-bc43-11ecd0f85693 attempt 1
    12:01:03 completed send_report 01a2458b-274b-7f1f-bc43-11ecd0f85693 0.4s
    12:01:04 failed    command 01a2458b-1ea9-74f8-bcc5-8e457c1c8108 0.1s flow_failed: exit 3

Times are the local wall clock (a terminal's reader's); the line is built from the host's
``on_event`` hook (``ResidentEngineHost``), so it costs nothing when nobody prints it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

import click

from taskward.host.models import Task

# A failure's detail is cut to its first line and this many characters.
MAX_DETAIL_CHARS: Final = 120

Hook = Callable[[str, Task, dict[str, Any]], None]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


class TaskLines:
    """An ``on_event`` hook printing a line per task state change (see the module docstring).

    ``kind_of(task_id)``: the task's action kind while it is claimed (the source's side
    channel), or None. ``echo``: where a line goes (stderr by default)."""

    def __init__(
        self,
        kind_of: Callable[[str], str | None],
        *,
        echo: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kind_of = kind_of
        self.echo = echo or (lambda line: click.echo(line, err=True))
        self.clock = clock
        self._started: dict[str, tuple[float, str]] = {}

    def _stamp(self) -> str:
        return datetime.fromtimestamp(self.clock()).strftime("%H:%M:%S")

    def __call__(self, event: str, task: Task, data: dict[str, Any]) -> None:
        key = f"{task.id}/{task.lease_id}"
        if event == "start":
            kind = self.kind_of(task.id) or "-"
            self._started[key] = (time.monotonic(), kind)
            self.echo(f"{self._stamp()} {'running':<9} {kind} {task.id} attempt {task.attempt}")
        elif event == "lease_lost":
            kind = self._started.get(key, (0.0, "-"))[1]
            self.echo(f"{self._stamp()} {'lost':<9} {kind} {task.id} lease lost: stopping it")
        elif event == "end":
            began, kind = self._started.pop(key, (time.monotonic(), "-"))
            outcome = str(data.get("outcome") or "ended")
            line = f"{self._stamp()} {outcome:<9} {kind} {task.id} {time.monotonic() - began:.1f}s"
            failure = data.get("failure")
            if failure is not None:
                detail = _first_line(str(getattr(failure, "detail", "") or ""))
                line += f" {getattr(failure, 'code', 'failed')}"
                if detail:
                    line += f": {detail[:MAX_DETAIL_CHARS]}"
            ack = data.get("ack")
            if ack is not None and not getattr(ack, "applied", True):
                line += f" (ack rejected: {getattr(ack, 'rejection', '?')})"
            self.echo(line)


def fan_out(*hooks: Hook | None) -> Hook:
    """One ``on_event`` hook calling each of ``hooks`` in turn (None ones skipped)."""
    live = [hook for hook in hooks if hook is not None]

    def hook(event: str, task: Task, data: dict[str, Any]) -> None:
        for each in live:
            each(event, task, data)

    return hook
