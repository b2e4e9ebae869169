"""View models of a task's dependencies on the dashboard (DESIGN.md R21): the task page's
"Depends on" / "Needed by" regions and why a waiting task waits, and the workflow view, the
task's connected dependency graph laid out in layers for a server-rendered SVG.

Pure: rows from ``dependencies.task_dependencies`` (walked by ``graphpages``) in, regions and a
layout out. Text stays text: the template draws it with Jinja's autoescape, in HTML and in the
SVG alike, never by building markup here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from taskward.dashboard.views import Region, cell, status_cell, table, task_href
from taskward.lifecycle import Status

DEPENDENCY_COLUMNS: Final = ("task", "status", "kind", "idempotency key")
# The workflow view draws at most this many tasks of a graph, read breadth-first from the task
# (one dependency read each): enough for a fan-out of a couple of hundred, bounded for the page.
MAX_GRAPH_NODES: Final = 200
# Waypoints of long edges (one per layer an edge passes) a layout places at most; past it, an
# edge is one curve (drawn behind the tasks it passes).
MAX_WAYPOINTS: Final = 2000
# A pending dependency list names at most this many short ids (then counts the rest).
_PENDING_SHOWN: Final = 5

# Layout, in SVG user units (pixels at 100 %).
NODE_W: Final = 210
NODE_H: Final = 46
GAP_X: Final = 70
GAP_Y: Final = 18
MARGIN: Final = 16
_LABEL_CHARS: Final = 29

STATUS_ORDER: Final = tuple(s.value for s in Status)


def short_id(task_id: str) -> str:
    """The last group of a UUID (its random part: the first ones are its time, shared by tasks
    made together), else the first 12 characters."""
    head, sep, tail = task_id.rpartition("-")
    return tail if sep and head and len(tail) >= 8 else task_id[:12]


def graph_href(task_id: str) -> str:
    return task_href(task_id) + "/graph"


def _fit(text: str, width: int = _LABEL_CHARS) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _dependency_rows(rows: Iterable[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    return [
        [
            cell(row["id"], href=task_href(str(row["id"])), cls="mono"),
            status_cell(str(row["status"])),
            cell(row.get("action_kind")),
            cell(row.get("idempotency_key"), cls="mono"),
        ]
        for row in rows
    ]


def dependency_regions(
    task_id: str, parents: Sequence[Mapping[str, Any]], children: Sequence[Mapping[str, Any]]
) -> dict[str, Region]:
    """The task page's "Depends on" (parents) and "Needed by" (children), shown when it has
    either, with a link to the workflow view."""
    linked = bool(parents or children)
    return {
        "dependencies": {"kind": "toggle", "visible": linked},
        "depends-on": table(
            DEPENDENCY_COLUMNS, _dependency_rows(parents), empty="depends on no task"
        ),
        "needed-by": table(
            DEPENDENCY_COLUMNS, _dependency_rows(children), empty="no task depends on it"
        ),
        "graph-link": {
            "kind": "link",
            "text": "workflow view" if linked else "",
            "href": graph_href(task_id) if linked else None,
        },
    }


def waiting_item(
    row: Mapping[str, Any], parents: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """Why a ``waiting_dependency`` task is not queued (R21): the dependencies that have not
    completed yet, by short id and status. None for a task in any other status."""
    if row.get("status") != Status.WAITING_DEPENDENCY.value:
        return None
    pending = [p for p in parents if p.get("status") != Status.COMPLETED.value]
    shown = ", ".join(f"{short_id(str(p['id']))} ({p['status']})" for p in pending[:_PENDING_SHOWN])
    more = len(pending) - _PENDING_SHOWN
    text = f"waiting for {len(pending)} of {len(parents)} dependencies"
    if shown:
        text += f": {shown}" + (f" and {more} more" if more > 0 else "")
    return {
        "key": "placement",
        "label": "placement",
        "text": text,
        "href": graph_href(str(row["id"])),
    }


# -- the workflow view ------------------------------------------------------------------------


@dataclass
class Graph:
    """A connected part of the dependency graph as read: rows by id, and links as
    ``(task_id, depends_on_id)`` pairs between read tasks. ``truncated``: more tasks are
    linked than ``MAX_GRAPH_NODES``."""

    focus: str
    nodes: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    edges: set[tuple[str, str]] = field(default_factory=set)
    truncated: bool = False


def layers_of(graph: Graph) -> dict[str, int]:
    """Each task's layer: the longest chain of read dependencies above it (a root is 0), so
    every edge points from a lower layer to a higher one. The graph is acyclic by construction
    (R21: ids exist before their dependents); Kahn's order makes that a checked fact."""
    parents: dict[str, list[str]] = {n: [] for n in graph.nodes}
    children: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for child, parent in sorted(graph.edges):
        parents[child].append(parent)
        children[parent].append(child)
    waiting = {n: len(ps) for n, ps in parents.items()}
    ready = sorted(n for n, k in waiting.items() if k == 0)
    layer = dict.fromkeys(ready, 0)
    while ready:
        node = ready.pop()
        for child in children[node]:
            layer[child] = max(layer.get(child, 0), layer[node] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    for node in graph.nodes:  # unreachable only if the links had a cycle: draw it, not hang
        layer.setdefault(node, 0)
    return layer


@dataclass
class _Layout:
    """What is placed: the tasks and, for each link spanning more than one layer, a waypoint in
    every layer between (so a long edge runs beside the tasks it passes, never behind them)."""

    layer: dict[str, int]
    parents: dict[str, list[str]]
    created: dict[str, float]
    # (task_id, depends_on_id) -> the waypoints of that edge, from the dependency's side.
    waypoints: dict[tuple[str, str], list[str]]


def _layout_of(graph: Graph) -> _Layout:
    layer = layers_of(graph)
    out = _Layout(
        layer=dict(layer),
        parents={n: [] for n in graph.nodes},
        created={n: float(graph.nodes[n].get("created_at") or 0.0) for n in graph.nodes},
        waypoints={},
    )
    budget = MAX_WAYPOINTS
    for child, parent in sorted(graph.edges):
        span = layer[child] - layer[parent]
        if not 1 < span <= budget:
            out.parents[child].append(parent)  # adjacent layers (or out of budget: one curve)
            continue
        budget -= span - 1
        chain = [f"\x00{child}\x00{parent}\x00{k}" for k in range(1, span)]
        previous = parent
        for k, point in enumerate(chain, start=1):
            out.layer[point] = layer[parent] + k
            out.parents[point] = [previous]
            out.created[point] = out.created[parent]
            previous = point
        out.parents[child].append(previous)
        out.waypoints[(child, parent)] = chain
    return out


def _order_layers(layout: _Layout) -> list[list[str]]:
    """Tasks and waypoints by layer; within a layer by the mean row of their parents (fewer
    crossings), then by creation time and id."""
    columns: list[list[str]] = [[] for _ in range(max(layout.layer.values(), default=0) + 1)]
    for node, at in layout.layer.items():
        columns[at].append(node)
    row_of: dict[str, int] = {}
    for column in columns:

        def rank(node: str) -> tuple[float, float, str]:
            rows = [row_of[p] for p in layout.parents[node] if p in row_of]
            return (sum(rows) / len(rows) if rows else -1.0, layout.created[node], node)

        column.sort(key=rank)
        row_of.update((node, i) for i, node in enumerate(column))
    return columns


def _curve(x1: int, y1: int, x2: int, y2: int) -> str:
    bend = max((x2 - x1) // 2, GAP_X // 2)
    return f" C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"


def graph_view(graph: Graph) -> dict[str, Any]:
    """The layered layout of ``graph`` for ``templates/graph.html``: x is the layer (roots on
    the left), y the order within it; each node a link to its task page, classed by status;
    each edge a curve from a dependency to its dependent (through its waypoints); the legend
    the statuses drawn."""
    layout = _layout_of(graph)
    columns = _order_layers(layout)
    tallest = max((len(c) for c in columns), default=1)
    width = 2 * MARGIN + len(columns) * NODE_W + (len(columns) - 1) * GAP_X
    height = 2 * MARGIN + tallest * NODE_H + (tallest - 1) * GAP_Y
    box: dict[str, tuple[int, int]] = {}
    nodes = []
    for col, column in enumerate(columns):
        top = MARGIN + (height - 2 * MARGIN - (len(column) * (NODE_H + GAP_Y) - GAP_Y)) // 2
        for i, node_id in enumerate(column):
            x, y = MARGIN + col * (NODE_W + GAP_X), top + i * (NODE_H + GAP_Y)
            box[node_id] = (x, y)
            if node_id not in graph.nodes:
                continue  # a waypoint: room for an edge, nothing drawn
            row = graph.nodes[node_id]
            status = str(row.get("status"))
            kind = str(row.get("action_kind") or "-")
            nodes.append(
                {
                    "id": node_id,
                    "x": x,
                    "y": y,
                    "href": task_href(node_id),
                    "status": status,
                    "label": short_id(node_id),
                    "sub": _fit(f"{kind} \u00b7 {status}"),
                    "title": f"task {node_id}: {kind}, {status}"
                    + (f", key {row['idempotency_key']}" if row.get("idempotency_key") else ""),
                    "is_focus": node_id == graph.focus,
                }
            )
    edges = []
    mid = NODE_H // 2
    for child, parent in sorted(graph.edges):
        px, py = box[parent]
        x, y = px + NODE_W, py + mid
        d = f"M{x},{y}"
        for point in layout.waypoints.get((child, parent), []):
            wx, wy = box[point]
            d += _curve(x, y, wx, wy + mid) + f" L{wx + NODE_W},{wy + mid}"
            x, y = wx + NODE_W, wy + mid
        cx, cy = box[child]
        d += _curve(x, y, cx, cy + mid)
        edges.append({"d": d, "label": f"{short_id(child)} depends on {short_id(parent)}"})
    drawn = {n["status"] for n in nodes}
    return {
        "width": width,
        "height": height,
        "node_w": NODE_W,
        "node_h": NODE_H,
        "nodes": nodes,
        "edges": edges,
        "legend": [s for s in STATUS_ORDER if s in drawn],
        "truncated": graph.truncated,
        "max_nodes": MAX_GRAPH_NODES,
        "focus": graph.focus,
        "focus_href": task_href(graph.focus),
    }


def graph_regions(graph: Graph) -> dict[str, Any]:
    """The workflow view: the drawing, and the same tasks as a table (by layer) for readers
    that do not see the drawing."""
    view = graph_view(graph)
    layer = layers_of(graph)
    ordered = sorted(graph.nodes.values(), key=lambda r: (layer[str(r["id"])], str(r["id"])))
    listing = table(
        ("layer", *DEPENDENCY_COLUMNS),
        (
            [cell(layer[str(r["id"])]), *line]
            for r, line in zip(ordered, _dependency_rows(ordered), strict=True)
        ),
        empty="no tasks",
    )
    return {"graph": view, "graph-tasks": listing}
