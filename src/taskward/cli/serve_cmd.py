"""``taskward serve`` (HTTP API and dashboard) and ``taskward up`` (the same plus a worker
runtime, its reaper, scheduler and outbox deliverer, in one process).

uvicorn runs programmatically in the same event loop as the WorkerRuntime. Signals are ours, not
uvicorn's: the first SIGTERM/SIGINT stops the server (no new connection is accepted; requests in
flight are answered) and drains the worker (running tasks finish and are acknowledged), and the
process exits 0 once both are done; only a second signal cancels running tasks cooperatively
(they go back to the queue, ``host_shutdown``). The server half ending never escalates the
worker's drain into a cancel (``WorkerRuntime.drain`` is idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shlex
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any, Final

import click
import uvicorn

from taskward import AdapterConfig, StateDB, TaskAdapterRegistry
from taskward.cli.common import CliState, pass_state, registry_for, run_worker_loop
from taskward.cli.tasklines import TaskLines, fan_out
from taskward.http import HttpConfig, Metrics, create_app
from taskward.models import EXECUTION_TARGETS
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.open import redact
from taskward.web.config import TOKENS_ENV, is_loopback
from taskward.web.state import StoreHandle

log = logging.getLogger("taskward.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# How long serve/up wait for the store before they listen anyway (answering 503 until it is
# open): time enough to be told a permanent refusal (PostgresDB.connect probes after 0.2 s), so
# that a database that does not exist ends the command before it listens.
STORE_WAIT_S: Final = 3.0


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service coordinates server and worker."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    if host in {"0.0.0.0", "::"}:
        shown = "127.0.0.1"
    return f"http://{shown}:{port}"


def _http_config(tokens_file: str | None, max_body_bytes: int | None) -> HttpConfig:
    config = HttpConfig.from_env(tokens_file=tokens_file)
    if max_body_bytes is not None:
        config = dataclasses.replace(config, max_body_bytes=max_body_bytes)
    return config


def _announce(
    command: str,
    base: str,
    db_url: str,
    config: HttpConfig,
    *,
    example_allowed: bool,
    worker: WorkerConfig | None,
    unfenced: tuple[str, ...] = (),
) -> None:
    example = (
        '{"action_kind": "command", "args": {"argv": ["echo", "hello from taskward"]}, '
        '"idempotency_key": "first-task"}'
    )
    # Double quotes: the shell expands $TOKEN (single quotes would send it literally). The
    # token itself is never printed, only the variable's name.
    auth = ' -H "Authorization: Bearer $TOKEN"' if config.auth_required else ""
    lines = [
        f"taskward {command}: serving on {base} (store {redact(db_url)})",
        f"  dashboard:   {base}/",
        f"  API:         {base}/api/tasks   (OpenAPI: {base}/openapi.json, metrics: "
        f"{base}/metrics)",
        "  first task:  curl -sS -X POST "
        f"{base}/api/tasks -H 'Content-Type: application/json'{auth} -d {shlex.quote(example)}",
    ]
    if not example_allowed:
        lines.append("               (needs echo in TASKWARD_COMMAND_ALLOWLIST)")
    if config.auth_required:
        names = ", ".join(t.name for t in config.tokens)
        lines.append(
            f"  access:      API tokens required ({names}): set TOKEN to yours for the curl "
            "above; the dashboard asks for one"
        )
    else:
        lines.append(
            f"  access:      no API token configured: loopback only (set {TOKENS_ENV} to change)"
        )
    if worker is not None:
        lines.append(
            f"  worker:      {worker.worker_id}, concurrency {worker.concurrency}, "
            f"targets {', '.join(worker.execution_targets)}"
        )
    if unfenced:
        lines.append(
            f"  adapters:    ALLOW ALL: {' and '.join(unfenced)} run anything a submitter names"
        )
    if worker is not None:
        lines.append(
            "  stop:        Ctrl-C (or SIGTERM) stops the server and lets running tasks finish;"
            " a second one cancels them (they go back to the queue)"
        )
    else:
        lines.append("  stop:        Ctrl-C (or SIGTERM) stops the server")
    for line in lines:
        click.echo(line)


async def run_service(
    *,
    command: str,
    db_url: str,
    host: str,
    port: int,
    registry: TaskAdapterRegistry,
    http_config: HttpConfig,
    worker_config: WorkerConfig | None,
    example_allowed: bool,
    unfenced: tuple[str, ...] = (),
    quiet: bool = False,
) -> int:
    """Serve until a signal; with ``worker_config``, run a worker runtime beside the server.

    The store opens in the background and is retried for as long as it is away (docs/http.md
    "Health and failures"): the service listens and answers 503 with Retry-After meanwhile, and
    the worker of ``up`` starts once the store is open. An error no waiting fixes (a bad URL, a
    database or role that does not exist, bad credentials) ends the service at once: before it
    listens when told within ``STORE_WAIT_S``, else as soon as it is."""
    sock = _bind(host, port)
    store = StoreHandle(url=db_url)
    try:
        opening = store.open_in_background()
        await asyncio.wait({opening}, timeout=STORE_WAIT_S)
        if opening.done():
            opening.result()  # a permanent store error: raised before listening
        else:
            click.echo(
                f"taskward {command}: the store {redact(db_url)} is not reachable yet: serving "
                "anyway, every route answers 503 (Retry-After) until it is back",
                err=True,
            )
        return await _serve(
            command=command,
            store=store,
            opening=opening,
            db_url=db_url,
            sock=sock,
            host=host,
            registry=registry,
            http_config=http_config,
            worker_config=worker_config,
            example_allowed=example_allowed,
            unfenced=unfenced,
            quiet=quiet,
        )
    finally:
        await store.close()
        sock.close()


async def _serve(
    *,
    command: str,
    store: StoreHandle,
    opening: asyncio.Task[StateDB],
    db_url: str,
    sock: socket.socket,
    host: str,
    registry: TaskAdapterRegistry,
    http_config: HttpConfig,
    worker_config: WorkerConfig | None,
    example_allowed: bool,
    unfenced: tuple[str, ...],
    quiet: bool,
) -> int:
    metrics = Metrics()
    app = create_app(store, registry, http_config, metrics=metrics)
    server = _Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=10,
            # The peer is the client unless the deployment names its proxies (HttpConfig).
            proxy_headers=bool(http_config.trusted_proxies),
            forwarded_allow_ips=list(http_config.trusted_proxies) or None,
        )
    )
    runtime: WorkerRuntime | None = None
    working: asyncio.Task[int] | None = None
    signals = 0

    async def work(config: WorkerConfig) -> int:
        """The worker half of ``up``: it starts once the store is open."""
        nonlocal runtime
        db = await asyncio.shield(opening)  # raises a permanent store error
        lines = None if quiet else TaskLines(lambda task_id: _kind_of(runtime, task_id))
        runtime = WorkerRuntime(db, registry, config, on_event=fan_out(metrics.worker_event, lines))
        return await runtime.run()

    def on_signal() -> None:
        # The first signal drains, only a second cancels (docs/http.md, like `taskward worker`):
        # the runtime is told ``drain`` or ``cancel_active`` by this count, never by how many
        # times something asked it to stop.
        nonlocal signals
        signals += 1
        if signals == 1:
            click.echo(
                f"taskward {command}: stopping (a second signal cancels running tasks)", err=True
            )
            server.should_exit = True
            if runtime is not None:
                runtime.drain("signal")
            elif working is not None:
                working.cancel()  # still waiting for the store: nothing runs yet
        else:
            click.echo(f"taskward {command}: cancelling running tasks", err=True)
            server.force_exit = True
            if runtime is not None:
                runtime.cancel_active()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        serving: asyncio.Task[Any] = asyncio.create_task(server.serve(sockets=[sock]))
        if worker_config is not None:
            working = asyncio.create_task(work(worker_config))
        # uvicorn exposes no start event, only this flag.
        while not server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if server.started:
            _announce(
                command,
                _url(host, sock.getsockname()[1]),
                db_url,
                http_config,
                example_allowed=example_allowed,
                worker=worker_config,
                unfenced=unfenced,
            )
            sys.stdout.flush()
        # ``serve`` watches the store's opening too: a permanent error found once it listens
        # (the server came back, but the database does not exist) stops it. ``up``'s worker
        # half awaits the opening itself.
        watched: set[asyncio.Future[Any]] = {serving}
        watched.add(working if working is not None else opening)
        while True:
            done, watched = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if done == {opening} and opening.exception() is None:
                continue  # the store is open: serve on
            break
        # One half ended (a signal, a failure, a memory-pressure drain): stop the other. The
        # worker drains (idempotent: after a first signal it is draining already), it is
        # never cancelled here.
        server.should_exit = True
        if runtime is not None:
            runtime.drain("server stopped")
        elif working is not None:
            working.cancel()  # the store never opened: no worker ran
        await asyncio.wait({t for t in (serving, working) if t is not None})
        serving.result()  # re-raise a server failure
        if opening.done() and not opening.cancelled():
            opening.result()  # re-raise a permanent store error
        code = working.result() if working is not None and not working.cancelled() else 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    click.echo(f"taskward {command}: stopped", err=True)
    return code


def _kind_of(runtime: WorkerRuntime | None, task_id: str) -> str | None:
    """A claimed task's action kind, from the worker's side channel (None once released)."""
    try:
        return str(runtime.source.claimed(task_id).row["action_kind"]) if runtime else None
    except KeyError:
        return None


def _serve_options(fn: Any) -> Any:
    fn = click.option(
        "--max-body-bytes",
        type=click.IntRange(min=1),
        help="Request body limit (default 1 MiB, or TASKWARD_HTTP_MAX_BODY_BYTES).",
    )(fn)
    fn = click.option(
        "--api-tokens-file",
        type=click.Path(dir_okay=False),
        help="File of API tokens, one 'name:token:scope+scope' a line (or "
        "TASKWARD_API_TOKENS_FILE).",
    )(fn)
    fn = click.option(
        "--port",
        type=click.IntRange(0, 65535),
        default=DEFAULT_PORT,
        show_default=True,
        help="Port (0 picks a free one).",
    )(fn)
    fn = click.option(
        "--host",
        default=DEFAULT_HOST,
        show_default=True,
        help="Address to listen on; a non-loopback one needs API tokens.",
    )(fn)
    return fn


def _logging() -> None:
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@click.command("serve")
@_serve_options
@pass_state
def serve(
    state: CliState,
    host: str,
    port: int,
    api_tokens_file: str | None,
    max_body_bytes: int | None,
) -> int:
    """Serve the HTTP API and the dashboard (no worker: run `taskward worker` beside it)."""
    http_config = _http_config(api_tokens_file, max_body_bytes)
    http_config.check_listen_address(host)
    adapter_config = AdapterConfig.from_env()
    registry = registry_for(state, adapter_config)
    allowlist = adapter_config.command_allowlist
    _logging()
    # Like ``taskward worker``: a drained service exits even while a synchronous task's thread
    # is still blocked past its deadline (asyncio.run would join that thread forever).
    return run_worker_loop(
        run_service(
            command="serve",
            db_url=state.db_url,
            host=host,
            port=port,
            registry=registry,
            http_config=http_config,
            worker_config=None,
            example_allowed=allowlist is None or "echo" in allowlist,
        )
    )


@click.command("up")
@_serve_options
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=4,
    show_default=True,
    help="Tasks the worker runs at once.",
)
@click.option(
    "--target",
    "targets",
    multiple=True,
    type=click.Choice(sorted(EXECUTION_TARGETS)),
    help="An execution target the worker serves (repeatable; default host).",
)
@click.option(
    "--capability",
    "capabilities",
    multiple=True,
    metavar="X",
    help="A capability the worker advertises (repeatable).",
)
@click.option(
    "--allow-all/--fenced",
    "allow_all",
    default=None,
    help="Let command and python run anything (the default on a loopback address), or only "
    "what TASKWARD_COMMAND_ALLOWLIST / TASKWARD_PYTHON_MODULES allow (the default elsewhere).",
)
@click.option("--quiet", is_flag=True, help="No per-task lines (a task's start and end).")
@pass_state
def up(
    state: CliState,
    host: str,
    port: int,
    api_tokens_file: str | None,
    max_body_bytes: int | None,
    concurrency: int,
    targets: tuple[str, ...],
    capabilities: tuple[str, ...],
    allow_all: bool | None,
    quiet: bool,
) -> int:
    """Run everything in one process: API, dashboard and a worker (with its reaper, scheduler
    and outbox deliverer), on the embedded SQLite default unless --db says otherwise.

    Each task's start and end is a line on stderr (time, status, kind, id, duration, a
    failure's reason); --quiet leaves them out."""
    http_config = _http_config(api_tokens_file, max_body_bytes)
    http_config.check_listen_address(host)
    if allow_all is None:
        allow_all = is_loopback(host)
    adapter_config = (
        AdapterConfig.from_env(command_allowlist=None, python_modules=None)
        if allow_all
        else AdapterConfig.from_env()
    )
    registry = registry_for(state, adapter_config)
    unfenced = adapter_config.unfenced_kinds()
    if unfenced:
        click.secho(
            f"WARNING: taskward up allows ALL: {' and '.join(unfenced)} tasks run any "
            "executable or Python function a submitter names. This is the local default; use "
            "--fenced (with TASKWARD_COMMAND_ALLOWLIST / TASKWARD_PYTHON_MODULES) anywhere else.",
            err=True,
            fg="yellow",
            bold=True,
        )
    worker_config = WorkerConfig(
        concurrency=concurrency,
        execution_targets=targets or ("host",),
        capabilities=capabilities,
    )
    allowlist = adapter_config.command_allowlist
    _logging()
    # Like ``taskward worker``: a drained service exits even while a synchronous task's thread
    # is still blocked past its deadline (asyncio.run would join that thread forever).
    return run_worker_loop(
        run_service(
            command="up",
            db_url=state.db_url,
            host=host,
            port=port,
            registry=registry,
            http_config=http_config,
            worker_config=worker_config,
            example_allowed=allowlist is None or "echo" in allowlist,
            unfenced=unfenced,
            quiet=quiet,
        )
    )
