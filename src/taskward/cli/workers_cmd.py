"""``taskward worker list`` and ``taskward worker prune``: the workers as an operator sees them
(issue 28): each one's state (live, stale: its heartbeat is old and it never said it stopped,
so it probably crashed, or stopped), its leases, and the removal of dead ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import click

from taskward.claims.spec import DEFAULT_HEARTBEAT_TTL_SECONDS
from taskward.cli.common import CliState, json_option, pass_state, with_db
from taskward.durations import parse_duration
from taskward.heartbeat import PRUNE_BATCH, prune_workers
from taskward.reads import MAX_LIST_LIMIT, list_workers

DEFAULT_PRUNE_AGE: Final = "1h"


FC = TypeVar("FC", bound=Callable[..., Any] | click.Command)


def fmt_age(seconds: float) -> str:
    """``42s``, ``3m``, ``5h``, ``2d``: how long ago, in the unit that fits."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def parse_age(_ctx: click.Context, param: click.Parameter, value: str) -> float:
    """A click callback: ``value`` as seconds (``durations``), or a usage error naming it."""
    try:
        return parse_duration(param.name or "duration", value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def older_than_option(help_text: str, *, default: str | None = None) -> Callable[[FC], FC]:
    """``--older-than AGE`` (seconds or ``30s``, ``5m``, ``2h``, ``1d``), parsed by
    ``parse_age``: required unless it has a ``default``. ``worker prune``, ``prune`` and
    ``archive`` take it."""
    return click.option(
        "--older-than",
        "older_than",
        required=default is None,
        default=default,
        show_default=default is not None,
        callback=parse_age,
        metavar="AGE",
        help=help_text,
    )


heartbeat_ttl_option = click.option(
    "--heartbeat-ttl",
    "heartbeat_ttl",
    default=f"{DEFAULT_HEARTBEAT_TTL_SECONDS:g}s",
    show_default=True,
    callback=parse_age,
    metavar="AGE",
    help="A worker whose heartbeat is older than this is stale (as the worker's own TTL).",
)


def _table(state: CliState, workers: Sequence[Mapping[str, Any]]) -> None:
    """One line per worker, narrow enough for 80 columns: the task ids are in --json."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("worker", overflow="fold", min_width=14)
    table.add_column("state", no_wrap=True)
    table.add_column("seen", justify="right", no_wrap=True)
    table.add_column("leases", justify="right", no_wrap=True)
    table.add_column("host", overflow="fold")
    table.add_column("pid", justify="right", no_wrap=True)
    styles = {"live": "green", "stale": "red", "stopped": "dim"}
    for w in workers:
        slots = w.get("concurrency")
        leases = len(w.get("lease_task_ids") or [])
        table.add_row(
            Text(str(w["worker_id"])),
            Text(str(w["state"]), style=styles.get(str(w["state"]), "")),
            Text(fmt_age(float(w["heartbeat_age_s"])) + " ago"),
            Text(f"{leases}/{slots}" if slots else str(leases)),
            Text(str(w.get("hostname") or "-")),
            Text(str(w.get("pid") or "-")),
        )
    state.output.out.print(table)


@click.command("list")
@heartbeat_ttl_option
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIST_LIMIT),
    default=200,
    show_default=True,
    help="Most workers shown (most recent heartbeat first).",
)
@json_option
@pass_state
def worker_list(state: CliState, heartbeat_ttl: float, limit: int) -> None:
    """List workers: state (live, stale, stopped), last heartbeat, leases held / slots."""
    workers = with_db(
        state.db_url, lambda db: list_workers(db, heartbeat_ttl=heartbeat_ttl, limit=limit)
    )
    if state.output.is_json:
        state.output.json({"workers": workers, "heartbeat_ttl_s": heartbeat_ttl})
    elif not workers:
        state.output.line("no worker has registered")
    else:
        _table(state, workers)


@click.command("prune")
@older_than_option(
    "Remove workers stale for longer than AGE (30s, 5m, 2h, 1d); stopped workers go "
    "whatever their age.",
    default=DEFAULT_PRUNE_AGE,
)
@heartbeat_ttl_option
@click.option("--dry-run", is_flag=True, help="Print what would be removed; remove nothing.")
@json_option
@pass_state
def worker_prune(state: CliState, older_than: float, heartbeat_ttl: float, dry_run: bool) -> None:
    """Remove stopped workers and workers stale for longer than --older-than.

    A worker holding a live lease is never removed. A worker removed while it still runs
    writes its row again with its next heartbeat.
    """

    async def run(db: Any) -> list[Any]:
        removed: list[Any] = []
        while True:
            batch = await prune_workers(
                db, older_than_s=older_than, heartbeat_ttl=heartbeat_ttl, dry_run=dry_run
            )
            removed += batch
            if dry_run or len(batch) < PRUNE_BATCH:
                return removed

    removed = with_db(state.db_url, run)
    verb = "would remove" if dry_run else "removed"
    if state.output.is_json:
        state.output.json(
            {
                "dry_run": dry_run,
                "older_than_s": older_than,
                "workers": [
                    {
                        "worker_id": w.worker_id,
                        "last_heartbeat_at": w.last_heartbeat_at,
                        "stopped_at": w.stopped_at,
                    }
                    for w in removed
                ],
            }
        )
        return
    for w in removed:
        why = "stopped" if w.stopped_at is not None else "stale"
        state.output.line(f"{verb} {w.worker_id} ({why})")
    state.output.line(f"{verb} {len(removed)} worker(s)")
