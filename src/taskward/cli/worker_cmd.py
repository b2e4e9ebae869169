"""``taskward worker``: the resident host over the local store."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from taskward import open_db
from taskward.claims import MIN_RENEWABLE_LEASE_TTL_SECONDS
from taskward.cli.common import CliState, registry_for, run_worker_loop
from taskward.host.models import Task
from taskward.models import EXECUTION_TARGETS
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.supervisor import MAX_PROCESSES, resolve_processes, run_supervisor

# Not replayed to a child: the supervisor's own options (each child gets its --worker-id, and
# its own --metrics-port: the first port + its slot - 1).
SUPERVISOR_ONLY = frozenset({"processes", "worker_id", "metrics_port"})


def _stamp() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]


def replayed_options(ctx: click.Context, skip: frozenset[str] = frozenset()) -> list[str]:
    """The options of ``ctx``'s command that its command line gave, as argv again.

    Only what came from the command line is replayed: a default is the child's default too,
    and a value from an environment variable (``TASKWARD_DATABASE_URL``) reaches the child
    through the environment it inherits, not through its argv (which ``ps`` shows)."""
    argv: list[str] = []
    for param in ctx.command.params:
        name = param.name
        if not isinstance(param, click.Option) or name is None or name in skip:
            continue
        if ctx.get_parameter_source(name) is not click.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        opt = max(param.opts, key=len)
        if param.is_flag and not param.secondary_opts:
            argv += [opt] if value else []
        elif param.is_flag:
            argv.append(opt if value else max(param.secondary_opts, key=len))
        elif param.multiple:
            for item in value:
                argv += [opt, str(item)]
        elif value is not None:
            argv += [opt, str(value)]
    return argv


def child_base_argv(ctx: click.Context) -> list[str]:
    """A supervised child's command line (R26): this interpreter running the same ``taskward
    ... worker ...`` as given, without ``--processes`` and ``--worker-id`` (the supervisor adds
    each child's own); an explicit argv list, never a shell."""
    root = ctx.find_root()
    assert ctx.info_name is not None
    return [
        sys.executable,
        "-m",
        "taskward.cli.main",
        *replayed_options(root),
        ctx.info_name,
        *replayed_options(ctx, SUPERVISOR_ONLY),
    ]


# A group so ``taskward worker list`` and ``taskward worker prune`` (``workers_cmd``) sit beside
# the worker itself: ``taskward worker [OPTIONS]`` without a subcommand runs a worker, as before.
@click.group("worker", invoke_without_command=True)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Tasks run at once (leases held never exceed it).",
)
@click.option(
    "--capability",
    "capabilities",
    multiple=True,
    metavar="X",
    help="A capability this worker advertises (repeatable).",
)
@click.option(
    "--target",
    "targets",
    multiple=True,
    type=click.Choice(sorted(EXECUTION_TARGETS)),
    help="An execution target this worker serves (repeatable; default host).",
)
@click.option("--worker-id", help="Worker id (default host:<8 hex>).")
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    help="Lease length in seconds. Without --renew a lease always covers the task's deadline; "
    "with it, a lease is this long and renewed every third of it.",
)
@click.option(
    "--renew",
    is_flag=True,
    help="Renew held leases every --lease-ttl / 3 (a --lease-ttl of at least 3 s), so a "
    "crashed worker's task is back within about --lease-ttl however long it runs.",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0.05),
    default=10.0,
    show_default=True,
    help="Seconds between heartbeats.",
)
@click.option(
    "--reap-interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Most seconds between reaper passes (a pass also runs as soon as a lease expires or "
    "a retry falls due).",
)
@click.option(
    "--idle-wait",
    type=click.FloatRange(min=0.05, max=3600.0),
    default=0.5,
    show_default=True,
    help="Seconds an idle worker waits before it looks for work again unless woken: new "
    "work wakes it at once (another process's on SQLite, another host's on PostgreSQL through "
    "LISTEN/NOTIFY), a delayed task when it falls due; this is the bound if a wake-up is lost.",
)
@click.option(
    "--default-timeout",
    type=click.FloatRange(min=0.01),
    default=240.0,
    show_default=True,
    help="Deadline of tasks whose args carry no timeout_s.",
)
@click.option(
    "--lease-slack",
    type=click.FloatRange(min=0.0),
    default=30.0,
    show_default=True,
    help="Seconds a lease outlives its deadline.",
)
@click.option(
    "--retry-base",
    type=click.FloatRange(min=0.0),
    default=2.0,
    show_default=True,
    help="First retry delay in seconds (doubles per attempt, with jitter) of kinds that set "
    "no backoff of their own (@taskward.task(backoff=...)).",
)
@click.option(
    "--memory-limit-mb",
    type=click.FloatRange(min=1.0),
    help="Drain and exit 75 (restart me) above this resident memory.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Exit 0 once no claimable work is left (for batch jobs and tests).",
)
@click.option("--quiet", is_flag=True, help="No per-task lines.")
@click.option(
    "--processes",
    default="1",
    show_default=True,
    metavar="N|auto",
    help=f"Worker processes under one supervisor, 1..{MAX_PROCESSES}, or auto (the CPU count); "
    "each has its own worker id (--worker-id becomes their prefix: ID-1, ID-2, ...). The "
    "supervisor restarts a child that exits 75 at once and one that crashes with backoff "
    "(docs/worker.md, Worker processes).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve this worker's Prometheus metrics on this port (any path, /metrics by "
    "convention; 0: any free port). With --processes N, child i serves PORT+i-1 "
    "(docs/operations.md, Metrics).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="The address --metrics-port listens on (0.0.0.0: every interface).",
)
@click.pass_context
def worker(
    ctx: click.Context,
    concurrency: int,
    capabilities: tuple[str, ...],
    targets: tuple[str, ...],
    worker_id: str | None,
    lease_ttl: float,
    renew: bool,
    heartbeat_interval: float,
    reap_interval: float,
    idle_wait: float,
    default_timeout: float,
    lease_slack: float,
    retry_base: float,
    memory_limit_mb: float | None,
    burst: bool,
    quiet: bool,
    processes: str,
    metrics_port: int | None,
    metrics_host: str,
) -> int:
    """Run a worker: claim, execute and acknowledge tasks until stopped.

    SIGTERM or Ctrl-C drains (no new claims; running tasks finish) and exits 0; a second signal
    cancels running tasks cooperatively, and they go back to the queue to be retried.

    With --processes N a supervisor runs N such workers, restarts them (exit 75 at once, a
    crash with backoff) and forwards those signals to each; it exits 0 when all drained cleanly.

    `taskward worker list` shows the workers and `taskward worker prune` removes dead ones.
    """
    if ctx.invoked_subcommand is not None:
        return 0
    state = ctx.ensure_object(CliState)
    from taskward.execution import RetryPolicy

    if renew and lease_ttl < MIN_RENEWABLE_LEASE_TTL_SECONDS:
        raise click.BadParameter(
            f"{lease_ttl:g} s is too short to renew: --renew needs at least "
            f"{MIN_RENEWABLE_LEASE_TTL_SECONDS:g} s (leases are renewed every --lease-ttl / 3)",
            param_hint="'--lease-ttl'",
        )
    try:
        process_count = resolve_processes(processes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--processes'") from exc
    if (
        process_count > 1
        and metrics_port is not None
        and not 1 <= metrics_port <= 65536 - process_count
    ):
        raise click.BadParameter(
            f"{metrics_port} with --processes {process_count}: child i serves PORT+i-1, so "
            f"PORT must be 1..{65536 - process_count}",
            param_hint="'--metrics-port'",
        )
    # Imported here too under a supervisor: a bad --import fails at once, not in a restart loop.
    registry = registry_for(state)
    if process_count > 1:
        return run_supervisor(
            child_base_argv(ctx),
            process_count,
            worker_id_prefix=worker_id,
            metrics_port=metrics_port,
        )
    config = WorkerConfig(
        concurrency=concurrency,
        capabilities=capabilities,
        execution_targets=targets or ("host",),
        lease_ttl=lease_ttl,
        renew=renew,
        heartbeat_interval_s=heartbeat_interval,
        reap_interval_s=reap_interval,
        idle_wait_s=idle_wait,
        default_timeout_s=default_timeout,
        lease_slack_s=lease_slack,
        retry_policy=RetryPolicy(base_s=retry_base),
        memory_limit_mb=memory_limit_mb,
        exit_when_idle=burst,
    )
    if worker_id:
        config.worker_id = worker_id
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    started: dict[str, float] = {}

    def on_event(kind: str, task: Task, data: dict[str, Any]) -> None:
        if quiet:
            return
        if kind == "start":
            started[f"{task.id}/{task.lease_id}"] = time.monotonic()
            click.echo(f"{_stamp()} start {task.id} attempt {task.attempt}", err=True)
        elif kind == "lease_lost":
            ack = data.get("ack")
            click.echo(
                f"{_stamp()} lost  {task.id} lease {task.lease_id} "
                f"({ack.rejection if ack else 'refused'}): stopping it",
                err=True,
            )
        else:
            now = time.monotonic()
            elapsed = now - started.pop(f"{task.id}/{task.lease_id}", now)
            ack = data.get("ack")
            failure = data.get("failure")
            outcome = data.get("outcome")
            detail = f" {failure.code}: {failure.detail[:120]}" if failure else ""
            rejected = f" (ack rejected: {ack.rejection})" if ack and not ack.applied else ""
            ceiling = " (attempt ceiling)" if ack and ack.rejection == "attempt_ceiling" else ""
            click.echo(
                f"{_stamp()} end   {task.id} {outcome}{detail}{rejected}{ceiling} "
                f"in {elapsed * 1000:.1f} ms",
                err=True,
            )

    async def run() -> int:
        async with open_db(state.db_url) as db:
            runtime = WorkerRuntime(db, registry, config, on_event=on_event)
            runtime.install_signal_handlers()
            renewing = f", leases of {lease_ttl:g} s renewed" if renew else ""
            click.echo(
                f"worker {runtime.worker_id} on {db.url}: concurrency {concurrency}, kinds "
                f"{', '.join(registry.kinds())}, targets {', '.join(config.execution_targets)}"
                f"{renewing}",
                err=True,
            )
            server = None
            if metrics_port is not None:
                from taskward.exposition import MetricsServer

                server = MetricsServer(runtime.metrics, port=metrics_port, host=metrics_host, db=db)
                try:
                    server.start()
                except OSError as exc:
                    raise click.ClickException(
                        f"--metrics-port {metrics_port} on {metrics_host}: {exc.strerror or exc}"
                    ) from exc
                click.echo(
                    f"worker {runtime.worker_id}: metrics on "
                    f"http://{metrics_host}:{server.port}/metrics",
                    err=True,
                )
            began = time.monotonic()
            try:
                code = await runtime.run()
            finally:
                if server is not None:
                    await asyncio.to_thread(server.stop)
            stats = runtime.host.stats
            click.echo(
                f"worker {runtime.worker_id} stopped ({stats.stop_reason or 'done'}) after "
                f"{time.monotonic() - began:.1f}s: claimed {stats.claimed}, completed "
                f"{stats.completed}, failed {stats.failed}, acknowledgements rejected "
                f"{stats.ack_rejected}, "
                + (f"leases renewed {stats.renewed}, lost {stats.leases_lost}, " if renew else "")
                + f"errors {len(stats.errors)}",
                err=True,
            )
            return code

    return run_worker_loop(run())
