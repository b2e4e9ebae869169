"""Rendering for the CLI: rich tables for people, JSON for scripts. No I/O besides printing.

Values from the store are shown as ``rich.text.Text`` so task args never act as console markup.
Times are epoch seconds in the store and UTC ISO-8601 here. rich is imported on the first
table, not with the CLI: a worker, which prints lines only, starts without it.
"""

from __future__ import annotations

import json
import os
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


def _cell(value: Any) -> Text:
    from rich.text import Text

    if value is None or value == "":
        return Text("-", style="dim")
    return Text(str(value))


def _value(name: str, value: Any) -> Text:
    from rich.text import Text

    if value is None:
        return Text("-", style="dim")
    if isinstance(value, dict | list):
        return Text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
    if (name.endswith("_at") or name == "run_after") and isinstance(value, int | float):
        return Text(f"{format_time(value)}  ({value})")
    return Text(str(value))


def _table(*, show_header: bool = True) -> Table:
    """The CLI's table style: a simple rule under the header, no outer edge."""
    from rich import box
    from rich.table import Table

    return Table(show_header=show_header, box=box.SIMPLE_HEAD, show_edge=False)


class Output:
    """Where a command's results go: stdout for results, stderr for notices and errors."""

    def __init__(self) -> None:
        self.is_json = False

    @cached_property
    def out(self) -> Console:
        """The console tables print to (stdout), made on first use."""
        return _console(stderr=False)

    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False))

    def line(self, text: str) -> None:
        click.echo(text)

    def notice(self, text: str) -> None:
        click.echo(f"taskward: {text}", err=True)

    def task(self, row: Mapping[str, Any]) -> None:
        """One schedule_runs row as a field/value table; JSON columns pretty-printed."""
        table = _table(show_header=False)
        table.add_column("field", style="bold", no_wrap=True)
        table.add_column("value", overflow="fold")
        for name, value in row.items():
            table.add_row(_cell(name), _value(name, value))
        self.out.print(table)

    def tasks(self, rows: Iterable[Mapping[str, Any]], next_cursor: str | None) -> None:
        """A listing, newest first, then how to get the next page."""
        rows = list(rows)
        if not rows:
            self.line("no tasks")
        else:
            table = _table()
            table.add_column("id", no_wrap=True, min_width=36)
            for name in ("status", "kind", "target"):
                table.add_column(name, no_wrap=True)
            table.add_column("attempts", justify="right")
            table.add_column("created", no_wrap=True)
            table.add_column("reason", overflow="fold")
            for row in rows:
                table.add_row(
                    _cell(row.get("id")),
                    _cell(row.get("status")),
                    _cell(row.get("action_kind")),
                    _cell(row.get("execution_target")),
                    _cell(row.get("lease_attempts")),
                    _cell(format_time(row.get("created_at"))),
                    _cell(row.get("status_reason_code")),
                )
            self.out.print(table)
        if next_cursor:
            self.line(f"next page: --cursor {next_cursor}")

    def transitions(self, facts: Iterable[Mapping[str, Any]]) -> None:
        """status_transitions facts, oldest first."""
        facts = list(facts)
        if not facts:
            self.line("no transitions yet (the task is as admitted)")
            return
        table = _table()
        table.add_column("time", no_wrap=True)
        table.add_column("transition", no_wrap=True)
        table.add_column("reason", no_wrap=True)
        table.add_column("summary", overflow="fold")
        table.add_column("actor", overflow="fold")
        table.add_column("lease", overflow="fold")
        for fact in facts:
            previous = fact.get("previous_status") or "-"
            table.add_row(
                _cell(format_time(fact.get("created_at"))),
                _cell(f"{previous} -> {fact.get('status')}"),
                _cell(fact.get("reason_code")),
                _cell(fact.get("reason_summary")),
                _cell(fact.get("actor")),
                _cell(fact.get("lease_id")),
            )
        self.out.print(table)
