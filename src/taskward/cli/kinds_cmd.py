"""``taskward kinds``: the task kinds this configuration registers (the built-in adapters, and
the ``@taskward.task`` functions of ``TASKWARD_IMPORTS`` / ``--import``), each with the JSON
Schema of its arguments where the kind has one (a typed function's: issue 29). Reads no store.
"""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from taskward.cli.common import CliState, json_option, pass_state, registry_for
from taskward.cli.output import new_table


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
    # Fits 80 columns (issue 28): the arguments beside the kind, its adapter on the line below.
    table = new_table()
    table.add_column("kind", no_wrap=True)
    table.add_column("arguments / adapter", overflow="fold")
    for row in rows:
        target = f" ({row['target']})" if row["target"] else ""
        table.add_row(
            row["kind"],
            Text(_arguments(row["args_schema"]), overflow="fold").append(
                f"\n{row['adapter']}{target}", style="dim"
            ),
        )
    out.out.print(table)
