"""What every command shares: per-invocation state, the store edge, the registry, input parsing."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from taskward import (
    Actor,
    AdapterConfig,
    StateDB,
    TaskAdapterRegistry,
    TaskValidationError,
    build_registry,
    open_db,
)
from taskward.cli.output import Output
from taskward.store.open import DEFAULT_URL

T = TypeVar("T")


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


def parse_args(text: str) -> dict[str, Any]:
    """``--args`` is JSON only (json.loads; never evaluated) and must be an object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskValidationError(
            "--args",
            text,
            "a JSON object",
            message=f"--args is not valid JSON ({exc}); pass a JSON object such as '{{\"a\": 1}}'",
        ) from exc
    if not isinstance(value, dict):
        raise TaskValidationError(
            "--args",
            text,
            "a JSON object",
            message=f"--args must be a JSON object, not a JSON {type(value).__name__}",
        )
    return value


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
    """A click group whose heavy subcommands (the HTTP service) import only when invoked, so
    every other command — and every worker — starts without loading the web stack."""

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
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


def template_options(fn: Any) -> Any:
    """The TaskApplication template options shared by ``task submit`` and ``schedule add``:
    --args, --target, --capability, --library-ref, --library-hash."""
    from taskward.models import DEFAULT_EXECUTION_TARGET, EXECUTION_TARGETS

    options = [
        click.option(
            "--args",
            "args_text",
            default="{}",
            metavar="JSON",
            help="The task's arguments as a JSON object.",
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
