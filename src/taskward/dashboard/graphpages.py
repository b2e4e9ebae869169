"""The dashboard's workflow view (DESIGN.md R21): ``/tasks/{id}/graph`` draws the task's
connected dependency graph as an inline SVG rendered on the server (no script, no library).

The graph is read breadth-first from the task, parents and children alike, two statements a
layer (``dependencies.linked_tasks``), up to ``graphviews.MAX_GRAPH_NODES`` tasks; a larger
graph is drawn as far as it was read and says so. The page does not poll: a reload
redraws it with the statuses of now.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from taskward.dashboard import graphviews, pages
from taskward.dependencies import linked_tasks
from taskward.store import StateDB
from taskward.web.state import Services

router = APIRouter(include_in_schema=False)


async def read_graph(
    db: StateDB, task_id: str, *, max_nodes: int = graphviews.MAX_GRAPH_NODES
) -> graphviews.Graph:
    """The tasks linked to ``task_id`` through any chain of dependencies, nearest first, at
    most ``max_nodes``, with every link between two of them (``dependencies.linked_tasks``).

    Raises:
        TaskNotFound: no task has this id.
    """
    found = await linked_tasks(db, task_id, max_nodes=max_nodes)
    graph = graphviews.Graph(focus=task_id, truncated=found.truncated)
    graph.nodes.update(found.nodes)
    graph.edges.update(found.edges)
    return graph


async def graph_data(db: StateDB, services: Services, request: Request) -> dict[str, Any]:
    graph = await read_graph(db, pages.task_id_of(request))
    return graphviews.graph_regions(graph)


@router.get("/tasks/{task_id}/graph")
async def graph_page(request: Request, task_id: str) -> Response:
    return await pages.render_page(request, "graph.html", graph_data, "", task_id=task_id)
