"""``taskward limit set|clear|list`` and ``taskward pause|resume KIND``: operators' limits
(DESIGN.md R20) as a terminal shows them. Parsing and rendering only; ``taskward.limits`` owns
the rules and the writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from taskward.cli.common import CliState, json_option, operator, parse_duration, pass_state, with_db
from taskward.limits import clear_limit, list_limits, pause_kind, resume_kind, set_limit


def _cell(value: Any) -> Text:
    if value is None or value == "":
        return Text("-", style="dim")
    return Text(str(value))


def _rate(row: Mapping[str, Any]) -> str | None:
    if row["rate"] is None:
        return None
    return f"{row['rate']} per {row['period_s']:g}s"


def _render(state: CliState, rows: Sequence[Mapping[str, Any]]) -> None:
    out = state.output
    if not rows:
        out.line("no limits")
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("key", no_wrap=True)
    table.add_column("max running", justify="right", no_wrap=True)
    table.add_column("running", justify="right", no_wrap=True)
    table.add_column("rate", no_wrap=True)
    table.add_column("in window", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for row in rows:
        if row["paused"]:
            status = Text("paused", style="yellow")
        elif row["free"] == 0:
            status = Text("full", style="yellow")
        else:
            status = Text(f"{row['free']} free", style="green")
        table.add_row(
            _cell(row["limit_key"]),
            _cell(row["max_running"]),
            _cell(row["running"] if row["max_running"] is not None else None),
            _cell(_rate(row)),
            _cell(row["recent"] if row["rate"] is not None else None),
            status,
        )
    out.out.print(table)


@click.group("limit")
def limit() -> None:
    """Limit how many tasks of a key run at once, or how often they start (R20).

    Every task has the key kind:<action_kind>; a task may also carry its own --limit-key.
    """


@limit.command("set")
@click.argument("key")
@click.option(
    "--max-running",
    type=int,
    metavar="N",
    help="At most N running at once (0 pauses the key).",
)
@click.option("--rate", type=int, metavar="N", help="At most N starts per --per period.")
@click.option("--per", "per", metavar="DURATION", help="The rate's period: 60s, 5m, 1h.")
@json_option
@pass_state
def limit_set(
    state: CliState, key: str, max_running: int | None, rate: int | None, per: str | None
) -> None:
    """Set KEY's limit (kind:<kind> or a task limit key), replacing the one it had."""
    period_s = parse_duration("--per", per) if per is not None else None
    actor = operator()
    row = with_db(
        state.db_url,
        lambda db: set_limit(
            db, key, max_running=max_running, rate=rate, period_s=period_s, actor=actor
        ),
    )
    if state.output.is_json:
        state.output.json(row)
    else:
        _render(state, [row])


@limit.command("clear")
@click.argument("key")
@json_option
@pass_state
def limit_clear(state: CliState, key: str) -> None:
    """Remove KEY's limit."""
    removed = with_db(state.db_url, lambda db: clear_limit(db, key))
    if state.output.is_json:
        state.output.json({"limit_key": key, "removed": removed})
    else:
        state.output.line(f"cleared {key}" if removed else f"{key} had no limit")


@limit.command("list")
@json_option
@pass_state
def limit_list(state: CliState) -> None:
    """Every limit with what counts against it now."""
    rows = with_db(state.db_url, list_limits)
    if state.output.is_json:
        state.output.json(rows)
    else:
        _render(state, rows)


@click.command("pause")
@click.argument("kind")
@json_option
@pass_state
def pause(state: CliState, kind: str) -> None:
    """Stop claiming tasks of KIND (running ones finish); `taskward resume KIND` undoes it."""
    actor = operator()
    row = with_db(state.db_url, lambda db: pause_kind(db, kind, actor=actor))
    if state.output.is_json:
        state.output.json(row)
    else:
        state.output.line(f"paused kind:{kind}")


@click.command("resume")
@click.argument("kind")
@json_option
@pass_state
def resume(state: CliState, kind: str) -> None:
    """Claim tasks of KIND again after `taskward pause KIND`."""
    actor = operator()
    resumed = with_db(state.db_url, lambda db: resume_kind(db, kind, actor=actor))
    if state.output.is_json:
        state.output.json({"kind": kind, "resumed": resumed})
    else:
        state.output.line(f"resumed kind:{kind}" if resumed else f"kind:{kind} was not paused")
