"""Same-key admissions racing from several processes (ADR-0072 D2), on both backends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

import taskward
from taskward.store.port import StateDB
from tests.integration.helpers import request, submit

PROCESSES = 4
KEYS = 25
ROOT = Path(__file__).parents[2]


def race(url: str, tmp_path: Path, variants: list[str]) -> list[list[dict[str, str]]]:
    start = tmp_path / "go"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.concurrency.admit_child",
                url,
                str(start),
                "race",
                variant,
                str(KEYS),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for variant in variants
    ]
    start.touch()
    results = []
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        results.append(json.loads(out))
    return results


@pytest.mark.slow
async def test_same_key_same_payload_from_many_processes_converges(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    results = await asyncio.to_thread(race, db_url, tmp_path, ["same"] * PROCESSES)
    for i in range(KEYS):
        ids = {r[i]["id"] for r in results}
        assert len(ids) == 1, f"key {i} produced {ids}"
    rows, _ = await taskward.list_tasks(db, limit=500)
    assert len(rows) == KEYS


@pytest.mark.slow
async def test_same_key_different_payloads_have_one_winner_and_explicit_conflicts(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    variants = [f"v{n}" for n in range(PROCESSES)]
    results = await asyncio.to_thread(race, db_url, tmp_path, variants)
    rows, _ = await taskward.list_tasks(db, limit=500, full_args=True)
    assert len(rows) == KEYS
    by_key = {r["idempotency_key"]: r for r in rows}
    for i in range(KEYS):
        outcomes = [r[i] for r in results]
        winners = [o for o in outcomes if "id" in o]
        conflicts = [o for o in outcomes if "conflict" in o]
        assert len(winners) == 1 and len(conflicts) == PROCESSES - 1
        row = by_key[f"race-{i}"]
        assert all(c["conflict"] == row["id"] == winners[0]["id"] for c in conflicts)
        # the stored payload is the winner's: its process saw its own id
        winner_variant = variants[outcomes.index(winners[0])]
        assert row["action_args"] == {"argv": ["echo", winner_variant]}


async def test_two_writers_racing_one_transition_have_exactly_one_winner(
    db: StateDB, db_url: str
) -> None:
    task_ids = [await submit(db) for _ in range(20)]
    other = await taskward.open_db(db_url)
    try:
        for task_id in task_ids:
            a = taskward.transition_task(
                db,
                request(task_id, "queued", "running", code="claimed"),
                guard={"leased_by": None},
                patch={"leased_by": "a", "lease_attempts": 1},
            )
            b = taskward.transition_task(
                other,
                request(task_id, "queued", "running", code="claimed"),
                guard={"leased_by": None},
                patch={"leased_by": "b", "lease_attempts": 1},
            )
            results = await asyncio.gather(a, b)
            assert sorted(r.applied for r in results) == [False, True]
            loser = next(r for r in results if not r.applied)
            assert loser.conflict and loser.current_state == "running"
            assert len(await taskward.list_transitions(db, task_id)) == 1
    finally:
        await other.close()


async def test_cancel_racing_a_terminal_write_has_one_outcome(db: StateDB, db_url: str) -> None:
    other = await taskward.open_db(db_url)
    try:
        for _ in range(10):
            task_id = await submit(db)
            await taskward.transition_task(
                db, request(task_id, "queued", "running", code="claimed")
            )
            complete = taskward.transition_task(
                db, request(task_id, "running", "completed", code="completed")
            )
            cancel = taskward.transition_task(
                other, request(task_id, "running", "cancelled", code="cancel_acknowledged")
            )
            results = await asyncio.gather(complete, cancel)
            assert sorted(r.applied for r in results) == [False, True]
            facts = await taskward.list_transitions(db, task_id)
            assert [f["status"] for f in facts][-1] in {"completed", "cancelled"}
            assert len(facts) == 2
    finally:
        await other.close()
