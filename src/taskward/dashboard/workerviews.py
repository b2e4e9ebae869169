"""View models of the dashboard's workers: the workers page and the overview's workers region
(rows -> regions, built from ``views``' cells and tables).

A worker is ``live``, ``stale`` (its heartbeat is older than the TTL and it never said it
stopped: it probably crashed, shown red) or ``stopped`` (it stopped cleanly, shown grey), as
``reads.list_workers`` says (issue 28). Every lease it holds links to its task; a stopped or
stale worker has a CSRF-protected "prune" button (``actions.prune_worker_from_page``) for an
operator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from taskward.dashboard.views import Cell, Region, action_cell, cell, fmt_age, table, task_href

WORKER_COLUMNS = (
    "worker",
    "state",
    "heartbeat age",
    "leased tasks",
    "targets",
    "capabilities",
    "concurrency",
    "host",
)


def prune_href(worker_id: str) -> str:
    return "/workers/" + quote(worker_id, safe="") + "/prune"


def leases_cell(task_ids: Sequence[str]) -> Cell:
    """Every task the worker holds the lease of, each a link (``links``: one per task)."""
    if not task_ids:
        return cell(None, cls="mono")
    return {
        "text": " ".join(task_ids),
        "links": [{"text": task_id, "href": task_href(task_id)} for task_id in task_ids],
        "cls": "mono leases",
    }


def state_cell(state: str) -> Cell:
    return cell(state, cls=f"worker-{state}")


def worker_rows(
    workers: Iterable[Mapping[str, Any]], *, can_operate: bool = False
) -> list[list[Cell]]:
    rows = []
    for w in workers:
        state = str(w["state"])
        line = [
            cell(w["worker_id"], cls="mono"),
            state_cell(state),
            cell(fmt_age(float(w["heartbeat_age_s"]))),
            leases_cell(w.get("lease_task_ids") or []),
            cell(", ".join(w.get("execution_targets") or [])),
            cell(", ".join(w.get("advertised_capabilities") or [])),
            cell(w.get("concurrency")),
            cell(w.get("hostname")),
        ]
        if can_operate:
            prunable = state != "live" and not w.get("lease_task_ids")
            line.append(action_cell([("prune", prune_href(w["worker_id"]))] if prunable else []))
        rows.append(line)
    return rows


def workers_table(workers: Sequence[Mapping[str, Any]], *, can_operate: bool = False) -> Region:
    columns = (*WORKER_COLUMNS, "") if can_operate else WORKER_COLUMNS
    return table(
        columns,
        worker_rows(workers, can_operate=can_operate),
        empty="no worker has registered",
    )


def workers_summary(workers: Sequence[Mapping[str, Any]]) -> Region:
    counts = {state: 0 for state in ("live", "stale", "stopped")}
    for w in workers:
        counts[str(w["state"])] = counts.get(str(w["state"]), 0) + 1
    text = f"{counts['live']} live of {len(workers)}"
    extra = [f"{n} {state}" for state, n in counts.items() if state != "live" and n]
    return {"kind": "text", "text": text + (f" ({', '.join(extra)})" if extra else "")}


def workers_regions(
    workers: Sequence[Mapping[str, Any]], *, can_operate: bool = False
) -> dict[str, Region]:
    return {
        "workers": workers_table(workers, can_operate=can_operate),
        "workers-summary": workers_summary(workers),
    }
