"""Several scheduler processes evaluating the same schedules over the same window of injected
time never duplicate a fire, and every nominal time is decided exactly once (R13), on both
backends."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import taskward
from taskward.schedules import cadence_of, create_schedule, get_schedule
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY

PROCESSES = 4
STEP = 3
COUNT = 80  # 240 s of injected time
T0 = int(datetime(2026, 1, 5, tzinfo=UTC).timestamp())
END = T0 + STEP * COUNT
ROOT = Path(__file__).parents[2]

SCHEDULES: dict[str, dict[str, Any]] = {
    # every nominal time fires: nothing can be missed or skipped
    "every-7s": {"interval_s": 7, "misfire_policy": "catch_up", "catch_up_max": 1000},
    "every-13s": {"interval_s": 13, "misfire_policy": "catch_up", "catch_up_max": 1000},
    "each-minute": {"cron": "* * * * *", "misfire_policy": "catch_up", "catch_up_max": 1000},
    # outcomes that depend on which process wins; the invariants still hold
    "fire-once": {"interval_s": 5, "misfire_policy": "fire_once"},
    "skip-late": {"interval_s": 4, "misfire_policy": "skip", "misfire_grace_s": 1},
    # the first fire stays queued, so every later one is an overlap skip
    "no-overlap": {"interval_s": 11, "overlap_policy": "skip", "misfire_policy": "catch_up"},
}


def race(url: str, tmp_path: Path) -> list[dict[str, int]]:
    start = tmp_path / "go"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.concurrency.schedule_child",
                url,
                str(start),
                str(T0),
                str(STEP),
                str(COUNT),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    start.touch()
    results = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        results.append(json.loads(out))
    return results


@pytest.mark.slow
async def test_scheduler_processes_never_duplicate_a_fire(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    ids = {}
    for name, policy in SCHEDULES.items():
        row = await create_schedule(
            db,
            name=name,
            action_kind="command",
            args={"argv": ["true"]},
            registry=REGISTRY,
            now=T0,
            **policy,
        )
        ids[name] = row["id"]
    results = await asyncio.to_thread(race, db_url, tmp_path)
    assert all(r["errors"] == 0 for r in results)

    rows, _ = await taskward.list_tasks(db, limit=500)
    keys = [r["idempotency_key"] for r in rows]
    assert len(keys) == len(set(keys))  # one row per key
    assert sum(r["admitted"] for r in results) >= len(rows)  # replays returned the same ids

    for name, schedule_id in ids.items():
        schedule = await get_schedule(db, schedule_id)
        cadence = cadence_of(schedule)
        window = list(itertools.takewhile(lambda t: t <= END, cadence.iter_after(T0)))
        runs = [r for r in rows if r["schedule_id"] == schedule_id]
        fired = sorted(int(r["idempotency_key"].rsplit(":", 1)[1]) for r in runs)
        assert all(r["status"] == "queued" and r["admission_source"] == "schedule" for r in runs)
        assert set(fired) <= set(window), name
        # each nominal time was decided exactly once: fired or skipped, never both
        assert schedule["pending_fires"] == [], name
        assert schedule["fire_count"] == len(fired), name
        assert schedule["fire_count"] + schedule["overlap_skips"] + schedule[
            "misfire_skips"
        ] == len(window), name
        assert schedule["next_fire_at"] == cadence.next_after(END), name
        if name in {"every-7s", "every-13s", "each-minute"}:
            assert fired == window, name
        if name == "no-overlap":
            assert fired == window[:1]
            assert schedule["overlap_skips"] == len(window) - 1
