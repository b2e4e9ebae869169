"""No claim strands a row the host cannot turn into a ``Task`` (ADR-0037 D1, R5), on both
backends: a row stored with an unbounded ``timeout_s`` (written before admission bounded it, or
around admission) is claimed with a deadline clamped to ``MAX_TASK_TIMEOUT_SECONDS``, and a
claimed row that still fails the model is failed at once with ``invalid_task``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from typing import Any

import psycopg
import pytest

import taskward
from taskward import Actor, TaskApplication
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import MAX_TASK_TIMEOUT_SECONDS, WorkerSpec, claim_rows
from taskward.errors import StoreUnavailable
from taskward.host import (
    AdapterRunner,
    LocalSummaryStore,
    LocalTaskSource,
    ResidentEngineHost,
    TaskSession,
)
from taskward.store.port import StateDB
from taskward.testing import wait_until

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))
OPERATOR = Actor(type="operator", id="test")


async def submit(db: StateDB) -> str:
    app = TaskApplication(
        action_kind="command",
        args={"argv": ["true"]},
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
    )
    return await taskward.submit_task(db, app, registry=REGISTRY)


def rewrite_args(db_url: str, task_id: str, args: dict[str, Any]) -> None:
    """Store ``args`` on the row behind admission's back, as an older version could have."""
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                "UPDATE schedule_runs SET action_args = ? WHERE id = ?", (json.dumps(args), task_id)
            )
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE schedule_runs SET action_args = %s::jsonb WHERE id = %s",
            (json.dumps(args), task_id),
        )


@pytest.mark.parametrize("timeout_s", [1e308, 1e12])
async def test_an_unbounded_stored_timeout_is_clamped_by_the_claim(
    db: StateDB, db_url: str, timeout_s: float
) -> None:
    # SQLite computes the lease in Python (claims._claim_parts); PostgreSQL in the claim's one
    # statement (run_claim_batch): both clamp.
    task_id = await submit(db)
    rewrite_args(db_url, task_id, {"argv": ["true"], "timeout_s": timeout_s})
    spec = WorkerSpec(worker_id="host:aaaaaaaa", kinds=REGISTRY.kinds(), lease_ttl=20.0)
    now = time.time()
    [claimed] = await claim_rows(db, spec, limit=1, now=now)
    row = await taskward.get_task(db, task_id)
    assert row["deadline_at"] == pytest.approx(now + MAX_TASK_TIMEOUT_SECONDS)
    assert row["lease_expires_at"] >= row["deadline_at"]
    assert claimed.lease.deadline_at == row["deadline_at"]


async def test_a_host_claims_a_clamped_row_and_cancel_still_reaches_it(
    db: StateDB, db_url: str
) -> None:
    task_id = await submit(db)
    rewrite_args(db_url, task_id, {"argv": ["sleep", "60"], "timeout_s": 1e308})
    registry = build_registry(AdapterConfig(command_allowlist=frozenset({"sleep"})))
    spec = WorkerSpec(worker_id="host:aaaaaaaa", kinds=registry.kinds(), lease_ttl=20.0)
    summaries = LocalSummaryStore(db)
    src = LocalTaskSource(db, spec, summaries=summaries)
    host = ResidentEngineHost(
        source=src,
        summaries=summaries,
        max_concurrent_tasks=1,
        session_factory=TaskSession,
        run_task=AdapterRunner(registry, src),
        idle_wait_s=0.02,
    )
    serve = asyncio.ensure_future(host.serve())
    try:

        async def running() -> bool:
            return bool(src.tokens)

        await wait_until(running, "the host to run the task", serving=serve)
        result = await taskward.request_task_cancel(
            db, task_id, actor=OPERATOR, idempotency_key="stop"
        )
        assert result.state == "cancellation_requested"
        # the worker's cancellation watcher is the runtime's; forward the request as it does
        src.tokens[task_id].cancel("cancel requested")

        async def cancelled() -> bool:
            return (await taskward.get_task(db, task_id))["status"] == "cancelled"

        await wait_until(cancelled, "the task to be cancelled", serving=serve, timeout_s=60)
    finally:
        host.stop_claiming("test finished")
        await asyncio.wait_for(serve, 30)


async def test_a_claimed_row_the_model_refuses_is_failed_as_invalid_task(db: StateDB) -> None:
    # A lease that cannot cover the deadline fails the Task model (ADR-0037 D1): here a worker
    # configured with a negative slack; any claimed row the model refuses is handled the same.
    task_id = await submit(db)
    spec = WorkerSpec(
        worker_id="host:aaaaaaaa", kinds=REGISTRY.kinds(), lease_ttl=1.0, lease_slack_s=-100.0
    )
    src = LocalTaskSource(db, spec)
    assert await src.claim_many(5) == []  # never handed to the host
    row = await taskward.get_task(db, task_id)
    assert (row["status"], row["status_reason_code"]) == ("failed", "invalid_task")
    assert "not a valid task" in row["error_detail"] and "deadline" in row["error_detail"]
    facts = [f["status"] for f in await taskward.list_transitions(db, task_id)]
    assert facts == ["running", "failed"]
    assert src.tokens == {}


async def test_an_invalid_row_the_store_cannot_fail_now_is_failed_at_the_next_claim(
    db: StateDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store is away when the refused row's failure is written: claim_many still answers
    # (no exception strands what it claimed), and the next claim writes the failure.
    await submit(db)
    spec = WorkerSpec(
        worker_id="host:aaaaaaaa", kinds=REGISTRY.kinds(), lease_ttl=1.0, lease_slack_s=-100.0
    )
    src = LocalTaskSource(db, spec)
    real = src._acknowledge
    calls = []

    async def away_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        if len(calls) == 1:
            raise StoreUnavailable("the store is away")
        return await real(*args, **kwargs)

    monkeypatch.setattr(src, "_acknowledge", away_once)
    [claimed] = await claim_rows_of(src)
    assert (await taskward.get_task(db, claimed))["status"] == "running"  # not failed yet
    assert await src.claim_many(5) == []  # the next claim fails it first
    row = await taskward.get_task(db, claimed)
    assert (row["status"], row["status_reason_code"]) == ("failed", "invalid_task")
    assert calls == [claimed, claimed] and src.tokens == {}


async def claim_rows_of(src: LocalTaskSource) -> list[str]:
    """Claim through the source; the ids it claimed (it hands the host none of them)."""
    before = set(src.tokens)
    assert await src.claim_many(5) == []
    return sorted(set(src.tokens) - before)
