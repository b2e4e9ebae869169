"""Parameters of the named statements the store conformance suite writes with (no assertions).

Only the port is used: rows go in through named statements (``run_insert_if_new``,
``fact_insert``, ``event_insert`` ...) and come back through ``run_get``/``fact_list``/...; JSON
travels as text, as every caller of the port sends it.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from taskward.ids import new_id
from taskward.store.port import Params

ARGS = {"argv": ["true"], "nested": {"n": 1}}
CAPABILITIES = ["gpu", "linux"]


class Executes(Protocol):
    """A ``StateDB`` or a ``Tx``: both run a named statement and return its row count."""

    async def execute(self, name: str, params: Params | None = None) -> int: ...


def run_params(**changes: Any) -> dict[str, Any]:
    """``run_insert_if_new``'s parameters for a new queued run (no ``now``: the store's)."""
    params: dict[str, Any] = {
        "id": new_id(),
        "schedule_id": None,
        "trigger_context": "{}",
        "action_kind": "command",
        "action_args": '{"argv":["true"],"nested":{"n":1}}',
        "concurrency_key": None,
        "required_capabilities": '["gpu","linux"]',
        "execution_target": "host",
        "library_ref": None,
        "library_content_hash": None,
        "idempotency_key": f"k-{uuid.uuid4()}",
        "application_hash": "sha256:x",
        "admission_source": "library",
        "chain_parent_id": None,
        "chain_depth": 0,
        "run_after": None,
        "priority": 0,
        "max_attempts": None,
        "limit_key": None,
        "trace_context": None,
    }
    params.update(changes)
    return params


async def insert_run(db: Executes, **changes: Any) -> str:
    """A new queued run; its id."""
    params = run_params(**changes)
    assert await db.execute("run_insert_if_new", params) == 1
    run_id: str = params["id"]
    return run_id


def fact_params(run_id: str, **changes: Any) -> dict[str, Any]:
    """``fact_insert``'s parameters for a ``queued -> running`` fact of ``run_id``."""
    params: dict[str, Any] = {
        "id": new_id(),
        "entity_type": "schedule_run",
        "entity_id": run_id,
        "previous_status": "queued",
        "status": "running",
        "reason_code": "claimed",
        "reason_summary": "",
        "evidence_refs": '["ref:1"]',
        "source": "worker",
        "actor": "worker:w1",
        "metadata": '{"m":1}',
        "idempotency_key": f"t-{uuid.uuid4()}",
        "request_hash": "sha256:r",
        "event_id": None,
        "lease_id": None,
    }
    params.update(changes)
    return params


def event_params(run_id: str, **changes: Any) -> dict[str, Any]:
    """``event_insert``'s parameters for a transition event of ``run_id``."""
    params: dict[str, Any] = {
        "id": new_id(),
        "task_id": run_id,
        "kind": "transition",
        "transition_id": None,
        "status": "running",
        "payload": '{"from":"queued","to":"running"}',
    }
    params.update(changes)
    return params


def lease(worker: str, expires_at: float, attempt: int = 1) -> dict[str, Any]:
    """The values of a ``queued -> running`` compare-and-swap under ``worker``'s lease."""
    return {
        "status": "running",
        "updated_at": expires_at - 30.0,
        "leased_by": worker,
        "lease_expires_at": expires_at,
        "lease_attempts": attempt,
    }
