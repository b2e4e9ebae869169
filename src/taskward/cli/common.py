"""What every command shares: per-invocation state, the store edge, the registry, input parsing."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import importlib
import json
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import click

from taskward import (
    Actor,
    AdapterConfig,
    StateDB,
    TaskAdapterRegistry,
    TaskValidationError,
    build_registry,
    durations,
    open_db,
)
from taskward.applications import MAX_ARGS_BYTES
from taskward.cli.output import Output
from taskward.store.open import DEFAULT_URL

T = TypeVar("T")

# How long a stopped worker waits for its idle executor threads to end before it exits anyway.
THREAD_GRACE_S: Final = 2.0


@dataclass
class CliState:
    """Per-invocation state handed to every command (no module-level singletons)."""

    db_url: str = DEFAULT_URL
    imports: tuple[str, ...] = ()
    output: Output = field(default_factory=Output)


pass_state = click.make_pass_decorator(CliState, ensure=True)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    ctx.ensure_object(CliState).output.is_json = value


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_set_json,
    help="Print machine-readable JSON instead of tables.",
)


def with_db(url: str, work: Callable[[StateDB], Awaitable[T]]) -> T:
    """Open the store, run ``work`` once and close it: the sync edge of the async core."""

    async def run() -> T:
        async with open_db(url) as db:
            return await work(db)

    return asyncio.run(run())


def generated_key() -> str:
    return f"cli:{uuid.uuid4()}"


def operator() -> Actor:
    return Actor(type="operator", id=os.environ.get("USER") or os.environ.get("USERNAME") or "cli")


# One duration parser for every binding (``taskward.durations``); re-exported for the CLI.
parse_duration = durations.parse_duration


RUN_AFTER_ALLOWED = (
    "an ISO 8601 time such as 2026-12-24T18:00:00Z or 2026-12-24T19:00+01:00 (without a "
    "zone: UTC), or epoch seconds"
)


def parse_time(option: str, text: str) -> float:
    """An ISO 8601 time (a naive one is UTC) or epoch seconds, as epoch seconds."""
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        try:
            when = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise TaskValidationError(option, text, RUN_AFTER_ALLOWED) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    if not math.isfinite(value):
        raise TaskValidationError(option, text, RUN_AFTER_ALLOWED)
    return value


# ``--args @FILE`` / ``--args -``: the most text read. Twice admission's bound on the args'
# canonical JSON (applications.MAX_ARGS_BYTES), so an indented file of legal args always fits;
# admission then checks the canonical size itself.
MAX_ARGS_TEXT_BYTES: Final = 2 * MAX_ARGS_BYTES


def read_args_text(text: str) -> str:
    """``--args``'s JSON text: the value itself, ``@FILE``'s content or, for ``-``, stdin's.

    Reads at most ``MAX_ARGS_TEXT_BYTES`` (more is refused, naming the bound), as UTF-8. A
    large argument goes through a file or stdin: a command line has a size limit of its own
    (the shell's "Argument list too long")."""
    if text != "-" and not text.startswith("@"):
        return text
    source = "stdin" if text == "-" else text[1:]
    data: bytes
    try:
        if text == "-":
            data = sys.stdin.buffer.read(MAX_ARGS_TEXT_BYTES + 1)
        else:
            with open(source, "rb") as handle:
                data = handle.read(MAX_ARGS_TEXT_BYTES + 1)
    except OSError as exc:
        raise TaskValidationError(
            "--args",
            text,
            "a JSON object, @FILE or - (stdin)",
            message=f"--args {text}: cannot read {source}: {exc.strerror or exc}",
        ) from exc
    if len(data) > MAX_ARGS_TEXT_BYTES:
        raise TaskValidationError(
            "--args",
            text,
            f"at most {MAX_ARGS_TEXT_BYTES} bytes",
            message=f"--args {text}: {source} is larger than {MAX_ARGS_TEXT_BYTES} bytes "
            f"(a task's args are at most {MAX_ARGS_BYTES} bytes of JSON)",
        )
    try:
        decoded: str = data.decode("utf-8-sig")
        return decoded
    except UnicodeDecodeError as exc:
        raise TaskValidationError(
            "--args",
            text,
            "UTF-8 JSON text",
            message=f"--args {text}: {source} is not UTF-8 ({exc.reason} at byte {exc.start})",
        ) from exc


def parse_args(text: str) -> dict[str, Any]:
    """``--args`` is JSON only (json.loads; never evaluated) and must be an object; ``@FILE``
    and ``-`` read it from a file or stdin (``read_args_text``)."""
    source = text
    text = read_args_text(text)
    where = "" if source is text else f" ({source})"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskValidationError(
            "--args",
            text,
            "a JSON object",
            message=f"--args{where} is not valid JSON ({exc}); pass a JSON object such as "
            "'{\"a\": 1}', @FILE or - (stdin)",
        ) from exc
    if not isinstance(value, dict):
        raise TaskValidationError(
            "--args",
            text,
            "a JSON object",
            message=f"--args{where} must be a JSON object, not a JSON {type(value).__name__}",
        )
    return value


def split_ids(values: tuple[str, ...]) -> list[str]:
    """A repeatable option's ids, each value also a comma-separated list (``--depends-on a,b``):
    stripped, empty pieces dropped; checked (R21) by admission."""
    return [piece.strip() for value in values for piece in value.split(",") if piece.strip()]


def registry_for(state: CliState, config: AdapterConfig | None = None) -> TaskAdapterRegistry:
    """The built-in adapters plus ``TASKWARD_IMPORTS`` and ``--import`` modules (``config``:
    the adapter configuration, default ``AdapterConfig.from_env()``)."""
    config = config or AdapterConfig.from_env()
    imports = tuple(dict.fromkeys((*config.imports, *state.imports)))
    if imports and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--import tasks` finds ./tasks.py, as python -m would
    for name in imports:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise TaskValidationError(
                "--import",
                name,
                "an importable module",
                message=f"--import {name!r} (or TASKWARD_IMPORTS) cannot be imported: {exc}",
            ) from exc
    return build_registry(dataclasses.replace(config, imports=imports))


class LazyGroup(click.Group):
    """A click group whose subcommands other than the everyday ones import only when invoked:
    the HTTP service (the web stack), ``schedule`` and ``outbox`` (their tables). Every worker
    starts without them, so it spawns sooner (measured:
    docs/benchmarks.md#figures-that-justified-design-choices)."""

    def __init__(
        self, *args: Any, lazy_subcommands: dict[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_subcommands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.partition(".")[0] not in SERVER_MODULES:
                raise
            raise click.ClickException(
                f"`taskward {cmd_name}` needs the HTTP service, which is not installed "
                f"({exc.name} is missing): pip install 'taskward[server]'"
            ) from None
        command = getattr(module, attr)
        assert isinstance(command, click.Command)
        return command


# What the `server` extra installs (pyproject.toml): the commands that need them say so.
SERVER_MODULES: Final = frozenset(
    {"fastapi", "uvicorn", "jinja2", "starlette", "itsdangerous", "pydantic_settings"}
)


def template_options(fn: Any) -> Any:
    """The TaskApplication template options shared by ``task submit`` and ``schedule add``:
    --args, --target, --capability, --library-ref, --library-hash."""
    from taskward.models import DEFAULT_EXECUTION_TARGET, EXECUTION_TARGETS

    options = [
        click.option(
            "--args",
            "args_text",
            default="{}",
            metavar="JSON|@FILE|-",
            help="The task's arguments as a JSON object, or @FILE to read it from FILE, or - "
            "from stdin (at most 2 MiB of text).",
        ),
        click.option(
            "--target",
            type=click.Choice(sorted(EXECUTION_TARGETS)),
            default=DEFAULT_EXECUTION_TARGET,
            show_default=True,
            help="Execution target.",
        ),
        click.option(
            "--capability",
            "capabilities",
            multiple=True,
            metavar="X",
            help="A capability a worker must advertise (repeatable).",
        ),
        click.option("--library-ref", help="Workflow library reference."),
        click.option("--library-hash", help="Workflow library content hash."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


# The cyclic garbage collector, tuned for a long-running worker process (worker, serve, up; never
# when taskward is a library in someone else's process). With CPython's default first threshold
# (700 container allocations) a no-op drain collected over and over, and its full collections
# walked every object the imports had made: a visible share of the worker's CPU. Everything alive
# once start-up is over is frozen out of the collector's view (gc.freeze), and the first
# threshold is raised (measured: docs/benchmarks.md#figures-that-justified-design-choices).
# Reference counting still frees almost everything at once; a cycle waits a little longer.
GC_FIRST_THRESHOLD: Final = 10_000


def tune_gc() -> None:
    """Freeze what start-up made and raise the collector's first threshold (see above)."""
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(GC_FIRST_THRESHOLD, second, third)


# The event loop of the same processes: uvloop's where it is installed (a dependency on CPython
# off Windows), asyncio's otherwise: less worker CPU a task on PostgreSQL (measured:
# docs/benchmarks.md#figures-that-justified-design-choices).
# TASKWARD_EVENT_LOOP chooses: ``auto`` (the default), ``uvloop`` (fails when it is missing) or
# ``asyncio``.
EVENT_LOOP_ENV: Final = "TASKWARD_EVENT_LOOP"
EVENT_LOOPS: Final = ("auto", "uvloop", "asyncio")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind ``TASKWARD_EVENT_LOOP`` chooses (see above)."""
    choice = os.environ.get(EVENT_LOOP_ENV, "").strip().lower() or "auto"
    if choice not in EVENT_LOOPS:
        raise click.UsageError(
            f"{EVENT_LOOP_ENV}={choice!r} is not an event loop; allowed: {', '.join(EVENT_LOOPS)}"
        )
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise click.UsageError(
                    f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed"
                ) from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run_worker_loop(main: Coroutine[Any, Any, int], *, grace_s: float = THREAD_GRACE_S) -> int:
    """``asyncio.run(main)`` without its unbounded wait for the loop's executor threads.

    A synchronous task function runs in a thread, which cannot be cancelled: one still blocked
    past its deadline (the watchdog already reported it) would keep a drained worker from ever
    exiting, since ``asyncio.run`` and the interpreter's exit both join every executor thread.
    Here the loop closes without waiting; threads still running ``grace_s`` later are abandoned
    and the process ends at once with ``main``'s exit code (every acknowledgement is committed
    and the store closed by then; standard streams are flushed first). The collector is tuned
    for a long run first (``tune_gc``); the loop is ``new_event_loop``'s.
    """
    loop = new_event_loop()
    tune_gc()
    try:
        asyncio.set_event_loop(loop)
        code = loop.run_until_complete(main)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()  # shuts the default executor down without waiting for it
    deadline = time.monotonic() + grace_s
    stuck = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            stuck.append(thread.name)
    if stuck:
        click.echo(
            f"abandoning {len(stuck)} thread(s) still blocked (a synchronous task past its "
            f"deadline): {', '.join(stuck)}",
            err=True,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
