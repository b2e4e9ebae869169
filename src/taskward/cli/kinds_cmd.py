"""``taskward kinds``: the task kinds this configuration registers (the built-in adapters, and
the ``@taskward.task`` functions of ``TASKWARD_IMPORTS`` / ``--import``), each with the JSON
Schema of its arguments where the kind has one (a typed function's: issue 29). Reads no store.
"""

from __future__ import annotations

from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from taskward.cli.common import CliState, json_option, pass_state, registry_for


def _kind_rows(state: CliState) -> list[dict[str, Any]]:
    registry = registry_for(state)
    rows = []
    for kind in registry.kinds():
        _, adapter = registry.resolve(kind)
        schema = getattr(adapter, "args_schema", None)
        rows.append(
            {
                "kind": kind,
                "adapter": type(adapter).__name__,
                "target": getattr(adapter, "target", None),
                "args_schema": schema() if callable(schema) else None,
            }
        )
    return rows


def _arguments(schema: dict[str, Any] | None) -> str:
    """``week: integer, when?: string | null`` (``?``: optional) from a JSON Schema."""
    if not schema:
        return "-"
    required = set(schema.get("required", ()))
    parts = []
    for name, spec in schema.get("properties", {}).items():
        types = [t.get("type") for t in spec.get("anyOf", ())] or [spec.get("type")]
        shown = " | ".join(str(t) for t in types if t) or "any"
        parts.append(f"{name}{'' if name in required else '?'}: {shown}")
    return ", ".join(parts) or "(none)"


@click.command("kinds")
@json_option
@pass_state
def kinds(state: CliState) -> None:
    """The task kinds this configuration registers, with their arguments (--json: each
    kind's JSON Schema)."""
    rows = _kind_rows(state)
    out = state.output
    if out.is_json:
        out.json(rows)
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("kind", no_wrap=True)
    table.add_column("adapter", no_wrap=True)
    table.add_column("arguments", overflow="fold")
    for row in rows:
        target = f" ({row['target']})" if row["target"] else ""
        table.add_row(
            row["kind"],
            Text(f"{row['adapter']}{target}"),
            Text(_arguments(row["args_schema"])),
        )
    out.out.print(table)
