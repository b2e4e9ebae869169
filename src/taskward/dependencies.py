"""Dependencies between tasks (DESIGN.md R21): the admission step that links a new task to the
tasks it depends on, and the reads of those links.

``link_admitted`` runs inside an admission's transaction, after the new rows were inserted
``queued``: it checks that every dependency exists while it locks it (``run_mark_dependencies``:
an ``UPDATE ... RETURNING`` that also marks it ``has_dependents``), writes one
``task_dependencies`` row per link, and moves each new task as the readiness rule says
(``transitions.readiness``): it stays ``queued`` when every dependency has completed, goes
``queued -> skipped`` (``dependency_failed``) when one ended otherwise, else
``queued -> waiting_dependency`` (``dependencies_pending``), each an audited transition through
``transitions.apply``. A missing id raises ``TaskValidationError`` listing them, and the caller's
transaction rolls back: nothing is stored.

Later moves (``waiting_dependency -> queued | skipped``) happen when a dependency ends, in that
transaction (``transitions.apply.settle_dependents``), or in the maintenance pass
(``maintenance.dependencies``). A cycle cannot be written: a dependency must exist before its
dependent is admitted, and links never change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from taskward.canonical import dumps
from taskward.errors import TaskNotFound, TaskValidationError
from taskward.lifecycle import Status
from taskward.store.port import Row, StateDB, Tx
from taskward.transitions import apply
from taskward.transitions.readiness import verdict, verdict_move

# How many missing ids an error lists (the rest are counted).
_MISSING_SHOWN: Final = 20
# The most parents or children ``task_dependencies`` returns for one task.
MAX_LISTED: Final = 1000


async def link_admitted(
    tx: Tx,
    links: Sequence[tuple[str, Sequence[str], float | None]],
) -> dict[str, str]:
    """Link each new task (``links``: its id, its sorted dependency ids, its ``run_after``) to
    its dependencies and move it as R21 says, in ``tx``. Returns each task's status after.

    Raises:
        TaskValidationError: ``depends_on`` names tasks that do not exist (listed).
    """
    wanted = sorted({dependency for _, depends_on, _ in links for dependency in depends_on})
    found = await tx.fetchall("run_mark_dependencies", {"ids": dumps(wanted)})
    statuses = {row["id"]: row["status"] for row in found}
    if len(statuses) < len(wanted):
        missing = [i for i in wanted if i not in statuses]
        shown = ", ".join(missing[:_MISSING_SHOWN])
        more = f" and {len(missing) - _MISSING_SHOWN} more" if len(missing) > _MISSING_SHOWN else ""
        raise TaskValidationError(
            "depends_on",
            missing[:_MISSING_SHOWN],
            "ids of existing tasks",
            message=f"depends_on names tasks that do not exist: {shown}{more}",
        )
    rows = [
        {"task_id": task_id, "depends_on_id": dependency}
        for task_id, depends_on, _ in links
        for dependency in depends_on
    ]
    await tx.write_many([("task_dependency_insert_many", rows)])
    after: dict[str, str] = {}
    moves = []
    for task_id, depends_on, run_after in links:
        found_verdict = verdict({d: statuses[d] for d in depends_on})
        after[task_id] = found_verdict.to_state
        move = verdict_move(
            task_id,
            Status.QUEUED.value,
            found_verdict,
            len(depends_on),
            run_after=run_after,
            now=tx.now,
        )
        if move is not None:
            moves.append(move)
    if moves:
        await apply(tx, moves)
    return after


async def task_dependencies(
    db: StateDB, task_id: str, *, limit: int = MAX_LISTED
) -> dict[str, list[Row]]:
    """R21: the tasks ``task_id`` depends on (``parents``) and those depending on it
    (``children``), each with its id, kind, status, key and times, in id order.

    Raises:
        TaskNotFound: no task has this id.
    """
    if await db.fetchone("run_status", {"id": task_id}) is None:
        raise TaskNotFound(task_id)
    params: dict[str, Any] = {"id": task_id, "limit": limit}
    return {
        "parents": await db.fetchall("task_parents", params),
        "children": await db.fetchall("task_children", params),
    }


# R21's invariants at quiescence (``checker``): code and detail of each problem.
_PROBLEMS: Final = {
    "unsettled": ("dependency_unsettled", "no dependency active, or one ended otherwise"),
    "unlinked": ("waiting_without_dependencies", "waiting with no task_dependencies row"),
    "early": ("started_before_dependency", "claimed before dependency {} completed"),
}


async def broken_links(db: StateDB) -> list[tuple[str, str, str]]:
    """R21's invariants, broken: ``(code, task id, detail)`` of each waiting task the readiness
    rule would move now (what the maintenance pass settles, at most 10,000 named), each waiting
    task without a link, and each task claimed before a dependency of it completed."""
    rows = await db.fetchall("check_dependencies")
    unlinked = {row["task_id"] for row in rows if row["problem"] == "unlinked"}
    found = [
        ("dependency_unsettled", row["id"], _PROBLEMS["unsettled"][1])
        for row in await db.fetchall("dependencies_settleable", {"limit": 10_000})
        if row["id"] not in unlinked  # reported as waiting_without_dependencies
    ]
    for row in rows:
        code, detail = _PROBLEMS[row["problem"]]
        found.append((code, row["task_id"], detail.format(row["dependency_id"])))
    return found


class LinkedTasks(NamedTuple):
    """A connected part of the dependency graph around a task: rows by id (as
    ``task_dependencies`` lists them), links as ``(task_id, depends_on_id)`` pairs between read
    tasks, and whether more tasks are linked than were read."""

    nodes: dict[str, Row]
    edges: set[tuple[str, str]]
    truncated: bool


async def linked_tasks(db: StateDB, task_id: str, *, max_nodes: int = 200) -> LinkedTasks:
    """The tasks linked to ``task_id`` through any chain of dependencies (either way), nearest
    first, at most ``max_nodes``, with every link between two of them: breadth-first, two
    statements a layer (its links, then its new tasks' rows), whatever the layer's width.

    Raises:
        TaskNotFound: no task has this id.
    """
    found = await db.fetchall("run_summaries", {"ids": dumps([task_id])})
    if not found:
        raise TaskNotFound(task_id)
    nodes: dict[str, Row] = {task_id: found[0]}
    edges: set[tuple[str, str]] = set()
    truncated = False
    frontier = [task_id]
    while frontier:
        links = await db.fetchall(
            "task_links_of", {"ids": dumps(frontier), "limit": max_nodes * MAX_LISTED}
        )
        new: list[str] = []
        for link in links:
            for other in (link["task_id"], link["depends_on_id"]):
                if other not in nodes and other not in new:
                    if len(nodes) + len(new) >= max_nodes:
                        truncated = True
                        continue
                    new.append(other)
        rows = await db.fetchall("run_summaries", {"ids": dumps(new)}) if new else []
        nodes.update((row["id"], row) for row in rows)
        edges.update(
            (link["task_id"], link["depends_on_id"])
            for link in links
            if link["task_id"] in nodes and link["depends_on_id"] in nodes
        )
        frontier = [row["id"] for row in rows]
    return LinkedTasks(nodes, edges, truncated)


__all__ = [
    "MAX_LISTED",
    "LinkedTasks",
    "broken_links",
    "link_admitted",
    "linked_tasks",
    "task_dependencies",
]
