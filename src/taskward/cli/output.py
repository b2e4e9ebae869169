"""Rendering for the CLI: rich tables for people, JSON for scripts. No I/O besides printing.

Values from the store are shown as ``rich.text.Text`` so task args never act as console markup.
Times are epoch seconds in the store and UTC here. rich is imported on the first table, not with
the CLI: a worker, which prints lines only, starts without it.

Every table fits the console's width (80 columns included): a long value is cut to its first
line with an ellipsis (``--json`` has it whole), and a task's reason sits under its id instead
of in a column of its own.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

# Wide enough that a listing piped to a file keeps full task ids on one line.
_PIPE_WIDTH: Final = 200
# A task id (a UUID): the id column's width, which the reason line under it shares.
ID_WIDTH: Final = 36
# `task show`: the longest value line before it wraps, whatever the terminal.
_MAX_SHOW_WIDTH: Final = 120


def _console(*, stderr: bool) -> Console:
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False, markup=False, emoji=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = _PIPE_WIDTH
    return console


def format_time(value: Any) -> str:
    """Epoch seconds -> ``YYYY-MM-DDTHH:MM:SSZ`` (UTC); other values unchanged."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return "-" if value is None else str(value)


def short_time(value: Any) -> str:
    """Epoch seconds -> ``MM-DD HH:MM:SS`` (UTC), a table's time; ``-`` for none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=UTC).strftime("%m-%d %H:%M:%S")
    return "-" if value is None else str(value)


def until(value: Any, now: float) -> str:
    """How far ahead epoch ``value`` is: ``in 5m``, ``in 3h`` ...; ``due`` once past."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return "due" if value <= now else f"in {age(now, value)}"


def age(value: Any, now: float) -> str:
    """How long ago epoch ``value`` was, in at most 5 characters: ``42s``, ``5m``, ``3h``,
    ``12d``, then the year."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    seconds = max(0.0, now - value)
    for unit, size in (("s", 60), ("m", 60), ("h", 24)):
        if seconds < size:
            return f"{int(seconds)}{unit}"
        seconds /= size
    if seconds < 365:
        return f"{int(seconds)}d"
    return datetime.fromtimestamp(value, tz=UTC).strftime("%Y")


def first_line(value: Any) -> str:
    """The first non-empty line of ``value`` (a multi-line output keeps its first line)."""
    for line in str(value or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def stacked(*lines: Any) -> Text:
    """A first column's cell: its first line as is, the others dim under it (each cut with an
    ellipsis to the column's width, ``ID_WIDTH``; empty ones left out)."""
    from rich.text import Text

    cell = Text(str(lines[0]), overflow="ellipsis", no_wrap=True)
    for line in lines[1:]:
        if line:
            cell.append("\n" + str(line), style="dim")
    return cell


def cell(value: Any, *, style: str = "") -> Text:
    """A table cell: ``-`` (dim) for nothing, else the value as plain text (never markup)."""
    from rich.text import Text

    if value is None or value == "":
        return Text("-", style="dim")
    return Text(str(value), style=style)


def _value_lines(name: str, value: Any) -> list[str]:
    if value is None:
        return ["-"]
    if isinstance(value, dict | list):
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    if (name.endswith("_at") or name == "run_after") and isinstance(value, int | float):
        return [f"{format_time(value)}  ({value})"]
    return str(value).splitlines() or [""]


def new_table(*, show_header: bool = True) -> Table:
    """The CLI's table style: a simple rule under the header, no outer edge or padding."""
    from rich import box
    from rich.table import Table

    return Table(
        show_header=show_header,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )


# Columns of a ``_table`` are this far apart: the right padding and the (blank) separator.
_GAP: Final = 2


class Output:
    """Where a command's results go: stdout for results, stderr for notices and errors."""

    def __init__(self) -> None:
        self.is_json = False

    @cached_property
    def out(self) -> Console:
        return _console(stderr=False)

    @property
    def width(self) -> int:
        """The width lines are fitted to: COLUMNS, else the terminal's, else (a pipe) 200."""
        return max(20, self.out.width)

    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False))

    def line(self, text: str) -> None:
        click.echo(text)

    def notice(self, text: str) -> None:
        click.echo(f"taskward: {text}", err=True)

    def task(self, row: Mapping[str, Any]) -> None:
        """One row as ``field  value`` lines: JSON values pretty-printed, long lines wrapped
        under the value column, no line padded to the terminal's width (a line exactly as wide
        as the terminal shows as two in some terminals)."""
        names = [str(name) for name in row]
        label = min(max((len(n) for n in names), default=0), 24) + 2
        room = max(20, min(self.width, _MAX_SHOW_WIDTH) - label)
        for name, value in row.items():
            head = str(name).ljust(label)
            lines = [
                piece
                for line in _value_lines(str(name), value)
                for piece in (
                    textwrap.wrap(
                        line,
                        room,
                        subsequent_indent=" " * (len(line) - len(line.lstrip())),
                        break_on_hyphens=False,
                        drop_whitespace=False,
                        replace_whitespace=False,
                    )
                    or [""]
                )
            ]
            for i, line in enumerate(lines):
                prefix = click.style(head, bold=True) if i == 0 else " " * label
                click.echo(f"{prefix}{line}".rstrip())

    def tasks(self, rows: Iterable[Mapping[str, Any]], next_cursor: str | None) -> None:
        """A listing, newest first, then how to get the next page. Each task is its id with
        its reason (code: first line of the summary) under it, then status, kind, attempts
        (made/allowed) and age (since it was created)."""

        rows = list(rows)
        if not rows:
            self.line("no tasks")
        else:
            with_target = any(row.get("execution_target") not in (None, "host") for row in rows)
            table = new_table()
            table.add_column("id / reason", no_wrap=True, max_width=ID_WIDTH)
            table.add_column("status", no_wrap=True)
            table.add_column("kind", overflow="fold")
            if with_target:
                table.add_column("target", overflow="fold")
            table.add_column("tries", justify="right", no_wrap=True)
            table.add_column("age", justify="right", no_wrap=True)
            now = time.time()
            for row in rows:
                cells = [
                    stacked(row.get("id"), task_reason(row)),
                    cell(row.get("status")),
                    cell(row.get("action_kind")),
                ]
                if with_target:
                    cells.append(cell(row.get("execution_target")))
                cells += [cell(attempts_text(row)), cell(age(row.get("created_at"), now))]
                table.add_row(*cells)
            self.out.print(table, width=self.width)
        if next_cursor:
            self.line(f"next page: --cursor {next_cursor}")

    def transitions(
        self,
        facts: Iterable[Mapping[str, Any]],
        cancels: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """status_transitions facts, oldest first, with the recorded cancel requests (their
        reason and who asked) between them; one line each (``--json`` has every field)."""

        facts, cancels = list(facts), list(cancels)
        moments = [r.get("created_at") for r in (*facts, *cancels)]
        one_day = len({short_time(m)[:5] for m in moments}) == 1

        def when(moment: Any) -> str:
            """One day: the time alone (the date is in `task show`); else MM-DD HH:MM:SS."""
            return short_time(moment)[6:] if one_day else short_time(moment)

        items: list[tuple[float, tuple[Text, ...]]] = []
        for fact in facts:
            previous = fact.get("previous_status") or "-"
            summary = first_line(fact.get("reason_summary"))
            actor = str(fact.get("actor") or "")
            if actor.startswith("operator:"):
                summary = f"{summary} (by {actor})" if summary else f"by {actor}"
            items.append(
                (
                    float(fact.get("created_at") or 0),
                    (
                        cell(when(fact.get("created_at"))),
                        cell(f"{previous} -> {fact.get('status')}"),
                        cell(fact.get("reason_code")),
                        cell(summary),
                    ),
                )
            )
        for cancel in cancels:
            reason = first_line(cancel.get("reason")) or "(no reason given)"
            items.append(
                (
                    float(cancel.get("created_at") or 0),
                    (
                        cell(when(cancel.get("created_at"))),
                        cell("cancel requested", style="yellow"),
                        cell("cancel_requested"),
                        cell(f"{reason} (by {cancel.get('actor') or '-'})"),
                    ),
                )
            )
        if not items:
            self.line("no transitions yet (the task is as admitted)")
            return
        # The summary takes what the other columns leave: one line each, cut with an ellipsis.
        fixed = sum(
            max(len(header), *(cells[i].cell_len for _, cells in items))
            for i, header in enumerate(("time (UTC)", "transition", "reason"))
        )
        room = max(8, self.width - fixed - 3 * _GAP)
        for _, cells in items:
            cells[3].truncate(room, overflow="ellipsis")
        table = new_table()
        table.add_column("time (UTC)", no_wrap=True)
        table.add_column("transition", no_wrap=True)
        table.add_column("reason", no_wrap=True)
        table.add_column("summary", no_wrap=True, overflow="ellipsis")
        for _, cells in sorted(items, key=lambda item: item[0]):
            table.add_row(*cells)
        self.out.print(table, width=self.width)


def attempts_text(row: Mapping[str, Any]) -> str:
    """``made/allowed`` (``2/3``), or the attempts made when the ceiling is not known."""
    made = row.get("lease_attempts")
    allowed = row.get("max_attempts")
    if made is None:
        return ""
    return f"{made}/{allowed}" if allowed is not None else str(made)


def task_reason(row: Mapping[str, Any]) -> str:
    """``code: first line of the summary`` of a task's last status change ('' when none)."""
    code = row.get("status_reason_code") or ""
    summary = first_line(row.get("status_reason_summary"))
    if code and summary:
        return f"{code}: {summary}"
    return code or summary


def cancel_requests(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``cancel_requested`` events of a task (who asked, why, when), oldest first."""
    found = []
    for event in events:
        if event.get("kind") != "cancel_requested":
            continue
        payload = event.get("payload") or {}
        if isinstance(payload, str):
            try:
                payload = json.loads(payload)
            except ValueError:
                payload = {}
        found.append(
            {
                "created_at": event.get("created_at"),
                "actor": payload.get("actor"),
                "reason": payload.get("reason") or "",
                "status": payload.get("current_status") or event.get("status"),
            }
        )
    return found
