"""Issue 8 scenario 5: cancellation racing completion.

Worker processes drain tasks of a few tens of milliseconds while this process cancels each of
them at a random moment -- before it is claimed, while it runs, as it completes, after it ended.
Whoever wins, every task ends with exactly one terminal fact, a cancelled task was really
stopped or never started (ADR-0072 D5), and a same-key retry of every cancel gives its answer
again.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

import taskward
from taskward import Actor
from taskward.store.port import StateDB
from tests.faults.support import (
    all_terminal,
    fault_worker_argv,
    settle_and_check,
    submit_many,
    supervised,
)
from tests.worker_procs import wait_until

pytestmark = pytest.mark.slow

ACTOR = Actor(type="operator", id="cancel-race")


@dataclass(frozen=True)
class Race:
    tasks: int
    workers: int
    concurrency: int
    spread_s: float  # cancels are issued at random moments over this long
    timeout_s: float


SHORT = Race(tasks=300, workers=2, concurrency=8, spread_s=3.0, timeout_s=90)
LONG = Race(tasks=5000, workers=4, concurrency=16, spread_s=40.0, timeout_s=900)


@pytest.mark.parametrize(
    "size",
    [pytest.param(SHORT, id="short"), pytest.param(LONG, id="long", marks=[pytest.mark.chaos])],
)
async def test_cancellation_racing_completion_leaves_exactly_one_terminal_fact(
    db: StateDB, db_url: str, tmp_path: Path, size: Race
) -> None:
    rng = random.Random(0xCA9CE1)
    acknowledged = await submit_many(db, "nap", size.tasks, {"seconds": 0.05, "timeout_s": 10})
    ids = list(acknowledged.values())
    answers: dict[str, str] = {}
    argvs = [
        fault_worker_argv(db_url, "--concurrency", str(size.concurrency))
        for _ in range(size.workers)
    ]
    began = time.monotonic()
    with supervised(argvs, tmp_path / "logs") as supervisor:
        await wait_until(lambda: _claimed_any(db), timeout=60, what="the workers to start claiming")
        moments = sorted((rng.uniform(0, size.spread_s), task_id) for task_id in ids)
        started = time.monotonic()

        async def cancel(at: float, task_id: str) -> None:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            result = await taskward.request_task_cancel(
                db, task_id, actor=ACTOR, idempotency_key=f"race:{task_id}", reason="race"
            )
            answers[task_id] = result.state

        gate = asyncio.Semaphore(32)

        async def gated(at: float, task_id: str) -> None:
            async with gate:
                await cancel(at, task_id)

        await asyncio.gather(*(gated(at, task_id) for at, task_id in moments))
        await wait_until(lambda: all_terminal(db), timeout=size.timeout_s, what="every task")
        assert await supervisor.stop_when_serving(db) == [0] * size.workers, supervisor.logs()
        assert supervisor.restarts == 0, supervisor.logs()
    elapsed = time.monotonic() - began

    outcomes: Counter[tuple[str, str, str]] = Counter()
    for task_id in ids:
        facts = await taskward.list_transitions(db, task_id)
        chain = [(f["status"], f["reason_code"]) for f in facts]
        final, answer = chain[-1], answers[task_id]
        outcomes[(answer, *final)] += 1
        if answer == "cancelled":  # cancelled while queued: never ran
            assert chain == [("cancelled", "cancelled")], chain
        elif answer == "cancellation_requested":  # running: stopped, or completion won
            assert chain in (
                [("running", "claimed"), ("cancelled", "cancel_acknowledged")],
                [("running", "claimed"), ("completed", "completed")],
            ), chain
        else:  # it had already ended: the cancel changed nothing
            assert answer == "already_terminal"
            assert chain == [("running", "claimed"), ("completed", "completed")], chain
    # the race really was run: some tasks were cancelled and some completed
    finals = Counter(final for _, final, _ in outcomes)
    assert finals["cancelled"] > 0 and finals["completed"] > 0, outcomes

    # a same-key retry of every cancel gives its first answer again and writes nothing
    before = await taskward.reads.count_transitions_by_edge(db)
    for task_id in rng.sample(ids, min(len(ids), 200)):
        again = await taskward.request_task_cancel(
            db, task_id, actor=ACTOR, idempotency_key=f"race:{task_id}", reason="race"
        )
        assert again.state == answers[task_id], task_id
    assert await taskward.reads.count_transitions_by_edge(db) == before
    await settle_and_check(db, acknowledged=acknowledged)
    print(f"\n{db.dialect}: {size.tasks} tasks, {dict(outcomes)}, {elapsed:.1f}s")


async def _claimed_any(db: StateDB) -> bool:
    counts = await taskward.reads.count_by_status(db)
    return counts.get("running", 0) + counts.get("completed", 0) > 0
