"""Why a queued task is not running: a placement reason computed on read (ADR-0072 D4).

Nothing is stored: the answer is derived from the row, the live workers' advertisements
(``workers`` rows with a fresh heartbeat) and the queue settings, so it is always current.
"""

from __future__ import annotations

import json
import time
from typing import Any

from taskward.capabilities import capability_class, worker_can_serve
from taskward.claims import DEFAULT_HEARTBEAT_TTL_SECONDS
from taskward.claims.limits import LimitState, row_keys
from taskward.errors import TaskNotFound
from taskward.store.port import StateDB


async def placement_reason(
    db: StateDB,
    task_id: str,
    *,
    now: float | None = None,
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
) -> dict[str, Any]:
    """``{"claimable": bool, "reason": str, ...}`` for a task; non-queued tasks say their state."""
    row = await db.fetchone("run_get", {"id": task_id})
    if row is None:
        raise TaskNotFound(task_id)
    if row["status"] != "queued":
        return {"claimable": False, "reason": f"task is {row['status']}, not queued"}
    if now is None:
        now = await db.now()
    if row["cancel_requested_at"] is not None:
        return {"claimable": False, "reason": "a cancellation request is pending"}
    max_attempts = row["max_attempts"]  # R18: the ceiling stored on the row at admission
    if row["lease_attempts"] >= max_attempts:
        return {
            "claimable": False,
            "reason": f"at the attempt ceiling ({row['lease_attempts']}/{max_attempts})",
        }
    if row["run_after"] is not None and row["queued_at"] > now:  # R16: not due yet
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row["queued_at"]))
        return {
            "claimable": False,
            "reason": f"delayed: runs at {at} (run_after)",
            "runs_at": row["queued_at"],
        }
    held = await _held_by_limit(db, row, now)
    if held is not None:
        return held
    workers = await db.fetchall("worker_live_list", {"now": now, "heartbeat_ttl": heartbeat_ttl})
    if not workers:
        return {
            "claimable": False,
            "reason": f"no live worker (no heartbeat within {heartbeat_ttl:.0f}s)",
        }
    kind, target = row["action_kind"], row["execution_target"]
    required = row["required_capabilities"] or []
    serving_kind = [w for w in workers if kind in (w["served_kinds"] or [])]
    if not serving_kind:
        return {
            "claimable": False,
            "reason": f"no live worker serves action_kind {kind!r}",
            "live_workers": len(workers),
        }
    serving_target = [
        w for w in serving_kind if not target or target in (w["execution_targets"] or [])
    ]
    if not serving_target:
        return {
            "claimable": False,
            "reason": f"no live worker serving {kind!r} advertises execution_target {target!r}",
        }
    able = [w for w in serving_target if worker_can_serve(required, w["advertised_capabilities"])]
    if not able:
        missing = sorted(
            {t for t in required if capability_class(t) != "affinity"}
            - set().union(*(set(w["advertised_capabilities"] or []) for w in serving_target))
        )
        return {
            "claimable": False,
            "reason": "no live worker advertises the required capabilities "
            f"{', '.join(missing) or ', '.join(required)}",
        }
    key = row["concurrency_key"]
    if key is not None:
        running = {r["concurrency_key"] for r in await db.fetchall("run_running_concurrency_keys")}
        if key in running:
            return {
                "claimable": False,
                "reason": f"waiting for serialization key {key!r}, held by a running task",
            }
    return {
        "claimable": True,
        "reason": f"claimable by {len(able)} live worker(s)",
        "workers": sorted(w["worker_id"] for w in able),
    }


async def _held_by_limit(db: StateDB, row: dict[str, Any], now: float) -> dict[str, Any] | None:
    """R20: the first of the row's limit keys that admits no claim now, as a placement reason."""
    keys = row_keys(row)
    states = await db.fetchall(
        "limit_state", {"keys": json.dumps(list(keys)), "now": now, "held_only": False}
    )
    for found in sorted(states, key=lambda r: keys.index(r["limit_key"])):
        state = LimitState.of(found)
        if state.free > 0:
            continue
        if state.max_running == 0:
            why = f"held by limit {state.limit_key}: paused (max_running 0)"
        elif state.max_running is not None and state.running >= state.max_running:
            why = (
                f"held by limit {state.limit_key}: {state.running} running of at most "
                f"{state.max_running}"
            )
        else:
            why = (
                f"held by limit {state.limit_key}: {state.recent} claims in the last "
                f"{state.period_s:g}s of at most {state.rate}"
            )
        return {"claimable": False, "reason": why, "limit_key": state.limit_key}
    return None
