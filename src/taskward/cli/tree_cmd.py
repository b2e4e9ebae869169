"""``taskward task tree``: a task's dependencies (DESIGN.md R21) as an indented tree.

Upward, what the task waits for (its parents, their parents ...); downward, what waits for it
(its children ...), each ``--depth`` levels deep, read with ``dependencies.task_dependencies``.
A task reached twice (a diamond) is expanded once and marked after; at most ``MAX_TREE_NODES``
tasks are read. Lines fit ``LINE_WIDTH`` columns: a short id (the UUID's last, random group:
the first ones are its time, shared by tasks made together), kind, status, key. ``--json`` has
the whole ids and rows.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import click

from taskward import StateDB, get_task
from taskward.cli.common import CliState, json_option, pass_state, with_db
from taskward.dependencies import task_dependencies

DEFAULT_DEPTH: Final = 3
MAX_DEPTH: Final = 20
# The most tasks one tree reads (one dependency read each), whatever its depth.
MAX_TREE_NODES: Final = 500
LINE_WIDTH: Final = 80
# A node's fields in the tree, as ``task_dependencies`` returns them.
FIELDS: Final = ("id", "action_kind", "status", "idempotency_key", "created_at", "ended_at")
_KIND_CHARS: Final = 20

Side = Literal["parents", "children"]


def short_id(task_id: str) -> str:
    """The last group of a UUID (its random part), else the first 12 characters."""
    head, sep, tail = task_id.rpartition("-")
    return tail if sep and head and len(tail) >= 8 else task_id[:12]


@dataclass
class _Walk:
    db: StateDB
    depth: int
    budget: int = MAX_TREE_NODES
    truncated: bool = False


async def _branch(
    walk: _Walk, rows: Sequence[Mapping[str, Any]], side: Side, level: int, seen: set[str]
) -> list[dict[str, Any]]:
    """``rows`` (one side's links of a node at ``level - 1``) as nodes, each expanded on the
    same side while levels and the node budget last."""
    out: list[dict[str, Any]] = []
    for row in rows:
        node = {name: row.get(name) for name in FIELDS}
        if row["id"] in seen:
            node["repeated"] = True  # expanded where it was first reached
            out.append(node)
            continue
        if walk.budget <= 0:
            walk.truncated = True
            break
        walk.budget -= 1
        seen.add(row["id"])
        links = (await task_dependencies(walk.db, row["id"]))[side]
        if level >= walk.depth:
            node[side] = []
            if links:
                node[f"more_{side}"] = len(links)  # beyond --depth
        else:
            node[side] = await _branch(walk, links, side, level + 1, seen)
        out.append(node)
    return out


async def dependency_tree(
    db: StateDB, task_id: str, *, depth: int = DEFAULT_DEPTH, max_nodes: int = MAX_TREE_NODES
) -> dict[str, Any]:
    """The task's row with ``parents`` and ``children`` trees ``depth`` levels deep.

    Each node is a row (``FIELDS``) with its own ``parents`` (resp. ``children``) list;
    ``more_parents``/``more_children`` counts links past ``depth``; a node reached a second time
    is ``repeated`` (not expanded again); ``truncated`` says the ``max_nodes`` budget ran out.

    Raises:
        TaskNotFound: no task has this id.
    """
    row = await get_task(db, task_id)
    links = await task_dependencies(db, task_id)
    walk = _Walk(db=db, depth=depth, budget=max_nodes)
    parents = await _branch(walk, links["parents"], "parents", 1, {task_id})
    children = await _branch(walk, links["children"], "children", 1, {task_id})
    return {
        "task": {name: row.get(name) for name in FIELDS},
        "parents": parents,
        "children": children,
        "depth": depth,
        "truncated": walk.truncated,
    }


def _glyphs() -> tuple[str, str, str, str]:
    """(branch, last branch, continuation, blank): box drawing where stdout can encode it."""
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "├└│─…".encode(encoding)
    except (LookupError, UnicodeEncodeError):
        return "|-- ", "`-- ", "|   ", "    "
    return "├── ", "└── ", "│   ", "    "


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def node_line(prefix: str, node: Mapping[str, Any], *, full_id: bool = False) -> str:
    """``prefix`` + id, kind, status, then the key in whatever room is left of the line."""
    task_id = str(node["id"])
    kind = _fit(str(node.get("action_kind") or "-"), _KIND_CHARS)
    main = f"{prefix}{task_id if full_id else short_id(task_id)}  {kind}  {node.get('status')}"
    if node.get("repeated"):
        main += "  (see above)"
    room = LINE_WIDTH - len(main) - 2
    key = str(node.get("idempotency_key") or "")
    if key and room >= 8 and not node.get("repeated"):
        main += "  " + _fit(key, room)
    return _fit(main, LINE_WIDTH)


def tree_lines(tree: Mapping[str, Any]) -> list[str]:
    """The tree as text lines (``dependency_tree``'s shape), each at most ``LINE_WIDTH``."""
    branch, last, cont, blank = _glyphs()
    lines = [node_line("", tree["task"], full_id=True)]

    def draw(nodes: Sequence[Mapping[str, Any]], side: Side, indent: str) -> None:
        for i, node in enumerate(nodes):
            is_last = i == len(nodes) - 1
            lines.append(node_line(indent + (last if is_last else branch), node))
            below = indent + (blank if is_last else cont)
            draw(node.get(side) or [], side, below)
            more = node.get(f"more_{side}")
            if more:
                lines.append(_fit(f"{below}{last}… {more} more (raise --depth)", LINE_WIDTH))

    sides: tuple[tuple[Side, str], ...] = (("parents", "depends on"), ("children", "needed by"))
    for side, title in sides:
        nodes = tree[side]
        lines.append(f"{title}:" if nodes else f"{title}: nothing")
        draw(nodes, side, "")
    if tree.get("truncated"):
        lines.append(f"… more not shown: a tree reads at most {MAX_TREE_NODES} tasks (--json too)")
    return lines


@click.command("tree")
@click.argument("task_id", metavar="ID")
@click.option(
    "--depth",
    type=click.IntRange(1, MAX_DEPTH),
    default=DEFAULT_DEPTH,
    show_default=True,
    help="Levels of parents and of children to show.",
)
@json_option
@pass_state
def task_tree(state: CliState, task_id: str, depth: int) -> None:
    """Show what task ID depends on and what depends on it (DESIGN.md R21), as a tree."""
    tree = with_db(state.db_url, lambda db: dependency_tree(db, task_id, depth=depth))
    if state.output.is_json:
        state.output.json(tree)
        return
    for line in tree_lines(tree):
        state.output.line(line)
