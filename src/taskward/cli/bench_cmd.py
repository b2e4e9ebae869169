"""``taskward bench``: measure the configured store, with a progress bar and a final table."""

from __future__ import annotations

import asyncio

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from taskward import open_db
from taskward.benchmark import run_bench
from taskward.cli.common import CliState, json_option, pass_state


@click.command("bench")
@click.option(
    "--count",
    type=click.IntRange(10, 1_000_000),
    default=2000,
    show_default=True,
    help="Tasks admitted one per call (and drained).",
)
@click.option(
    "--bulk-count",
    type=click.IntRange(0, 1_000_000),
    default=10_000,
    show_default=True,
    help="Tasks admitted in bulk (and drained).",
)
@click.option(
    "--pickup-count",
    type=click.IntRange(5, 10_000),
    default=100,
    show_default=True,
    help="Tasks submitted one at a time to an idle worker.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=128,
    show_default=True,
    help="The draining worker's concurrency (128: the fastest no-op drain measured on both "
    "backends; 64 and 192 were slower).",
)
@json_option
@pass_state
def bench(state: CliState, count: int, bulk_count: int, pickup_count: int, concurrency: int) -> int:
    """Measure admission (single and bulk), a drain by a real worker process, and pickup
    latency, then check every task the run created. Writes only its own tasks."""
    out = state.output
    console = Console(stderr=True)

    async def run() -> int:
        async with open_db(state.db_url) as db:
            with Progress(
                TextColumn("{task.description:>15}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=console,
                transient=out.is_json,
            ) as bar:
                stages: dict[str, object] = {}

                def progress(stage: str, done: int, total: int) -> None:
                    if stage not in stages:
                        stages[stage] = bar.add_task(stage, total=total)
                    bar.update(stages[stage], completed=min(done, total))  # type: ignore[arg-type]

                result = await run_bench(
                    db,
                    url=state.db_url,
                    count=count,
                    bulk_count=bulk_count,
                    pickup_count=pickup_count,
                    concurrency=concurrency,
                    progress=progress,
                )
        if out.is_json:
            out.json(result.as_dict())
        else:
            table = Table(title=f"taskward bench on {result.backend} (run {result.run_id})")
            table.add_column("measure")
            table.add_column("value", justify="right")
            table.add_row("admission, one per call", f"{result.admission_per_s:,.0f} /s")
            table.add_row(
                "admission, bulk (1000 per call)", f"{result.bulk_admission_per_s:,.0f} /s"
            )
            table.add_row(
                f"drain, 1 worker x {result.drain_concurrency}", f"{result.drain_per_s:,.0f} /s"
            )
            table.add_row(
                "pickup p50 / p95 / p99",
                f"{result.pickup_p50_ms:.1f} / {result.pickup_p95_ms:.1f} / "
                f"{result.pickup_p99_ms:.1f} ms",
            )
            table.add_row("tasks checked", str(result.tasks))
            table.add_row(
                "rows per task", ", ".join(f"{k} {v:.2f}" for k, v in result.rows_per_task.items())
            )
            table.add_row("violations", str(len(result.violations)))
            Console().print(table)
            for violation in result.violations[:10]:
                console.print(f"violation: {violation}")
        return 1 if result.violations else 0

    return asyncio.run(run())
