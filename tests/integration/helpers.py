"""Small builders shared by integration tests (no assertions here)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import taskward
from taskward import Actor, StateReason, TaskApplication, TransitionRequest
from taskward.adapters import AdapterConfig, build_registry
from taskward.store.port import StateDB

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true", "echo"})))
SYSTEM = Actor(type="system", id="test")


async def submit(db: StateDB, *, now: float | None = None, **changes: Any) -> str:
    fields: dict[str, Any] = {
        "action_kind": "command",
        "args": {"argv": ["true"]},
        "execution_target": "host",
        "idempotency_key": f"k-{uuid.uuid4()}",
    }
    fields.update(changes)
    return await taskward.submit_task(db, TaskApplication(**fields), registry=REGISTRY, now=now)


def request(
    task_id: str,
    src: str,
    dst: str,
    *,
    code: str = "operator",
    key: str | None = None,
    summary: str = "",
) -> TransitionRequest:
    return TransitionRequest(
        entity_id=task_id,
        from_state=src,
        to_state=dst,
        reason=StateReason(code=code, summary=summary),
        actor=SYSTEM,
        idempotency_key=key or f"t-{uuid.uuid4()}",
    )


async def move(db: StateDB, task_id: str, *path: str, now: float | None = None) -> None:
    """Walk ``task_id`` along ``path`` (each step must apply)."""
    for src, dst in itertools.pairwise(path):
        result = await taskward.transition_task(db, request(task_id, src, dst), now=now)
        assert result.applied, (src, dst, result)


class Turns:
    """Counts event-loop turns: a task that yields once per turn, counting as it goes."""

    def __init__(self) -> None:
        self.count = 0
        self._task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1

    def stop(self) -> None:
        self._task.cancel()


async def lapse_lease(db: StateDB, task_id: str) -> None:
    """Let a running task's lease run out now, as a crashed owner's would: the row's stored
    expiry moves to just before the store's clock (a compare-and-swap on the lease as read;
    owner, attempt and deadline kept), so a reaper on the store's clock recovers it. A reaper at
    an injected future time would requeue it at that time instead, and R16 keeps a row queued in
    the future from a claim made now."""
    row = await taskward.get_task(db, task_id)
    async with db.transaction() as tx:
        lapsed = await tx.run_update_if(
            task_id,
            "running",
            {"lease_expires_at": tx.now - 0.001},
            {
                "leased_by": row["leased_by"],
                "lease_attempts": row["lease_attempts"],
                "lease_expires_at": row["lease_expires_at"],
            },
        )
    assert lapsed is not None, row
