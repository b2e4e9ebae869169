"""The scheduling fields (DESIGN.md R15-R18) and limits (R20) over HTTP, on both backends:
httpx against the ASGI app, as a client drives it."""

from __future__ import annotations

import time

import httpx
import pytest

import taskward
from taskward.http import HttpConfig
from taskward.store import StateDB
from tests.acceptance.test_http_api import ADMIN, READER, TOKENS, Client, assert_problem, rows
from tests.acceptance.test_http_api import make_client as make_client

ECHO = {"action_kind": "command", "args": {"argv": ["echo", "hi"]}}


@pytest.fixture
def client(make_client: Client) -> httpx.AsyncClient:
    return make_client()


async def test_the_scheduling_fields_are_admitted_and_stored(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    body = {
        **ECHO,
        "idempotency_key": "k-fields",
        "run_after": 4102444800,
        "priority": 7,
        "max_attempts": 5,
        "limit_key": "tenant:acme",
    }
    r = await client.post("/api/tasks", json=body)
    assert r.status_code == 201, r.text
    row = await taskward.get_task(db, r.json()["task_id"])
    assert (row["run_after"], row["priority"], row["max_attempts"], row["limit_key"]) == (
        4102444800.0,
        7,
        5,
        "tenant:acme",
    )
    shown = (await client.get(f"/api/tasks/{row['id']}")).json()
    assert shown["priority"] == 7 and shown["run_after"] == 4102444800.0
    assert shown["placement"]["reason"].startswith("delayed: runs at 2100-01-01")
    again = await client.post("/api/tasks", json=body)
    assert again.status_code == 200
    conflict = await client.post("/api/tasks", json={**body, "priority": 8})
    assert_problem(conflict, 409)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 101),
        ("priority", "5"),
        ("priority", True),
        ("max_attempts", 0),
        ("max_attempts", 2.5),
        ("run_after", -5),
        ("run_after", "tomorrow"),
        ("delay_s", -1),
        ("limit_key", "kind:command"),
    ],
)
async def test_a_bad_scheduling_field_is_a_422_naming_it(
    client: httpx.AsyncClient, db: StateDB, field: str, value: object
) -> None:
    r = await client.post("/api/tasks", json={**ECHO, field: value})
    problem = assert_problem(r, 422)
    assert field in problem["detail"], problem
    assert await rows(db) == 0


async def test_delay_s_sets_run_after_and_a_retry_with_the_key_replays(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    before = time.time()
    first = await client.post("/api/tasks", json={**ECHO, "idempotency_key": "d1", "delay_s": 120})
    assert first.status_code == 201, first.text
    row = await taskward.get_task(db, first.json()["task_id"])
    assert before + 119 <= row["run_after"] <= time.time() + 121
    assert row["queued_at"] == row["run_after"]
    again = await client.post("/api/tasks", json={**ECHO, "idempotency_key": "d1", "delay_s": 120})
    assert again.status_code == 200 and again.json()["task_id"] == row["id"]
    both = await client.post("/api/tasks", json={**ECHO, "delay_s": 5, "run_after": 4102444800})
    assert_problem(both, 422)


async def test_limits_are_set_listed_paused_and_cleared(
    make_client: Client,
    db: StateDB,
) -> None:
    admin = make_client(HttpConfig(tokens=TOKENS), token=ADMIN)
    reader = make_client(HttpConfig(tokens=TOKENS), token=READER)
    r = await admin.put("/api/limits/tenant:acme", json={"max_running": 3})
    assert r.status_code == 200, r.text
    assert r.json()["max_running"] == 3 and r.json()["updated_by"] == "operator:alice"
    r = await admin.put("/api/limits/tenant:acme", json={"rate": 10, "period_s": 60})
    assert (r.json()["max_running"], r.json()["rate"]) == (None, 10)
    assert_problem(await admin.put("/api/limits/tenant:acme", json={"rate": 10}), 422)
    assert_problem(await admin.put("/api/limits/kind:", json={"max_running": 1}), 422)
    assert_problem(await admin.put("/api/limits/x", json={"max_running": -1}), 422)
    assert_problem(await admin.put("/api/limits/x", json={"oops": 1}), 422)
    paused = await admin.post("/api/kinds/command/pause")
    assert paused.status_code == 200 and paused.json()["paused"]
    listed = (await reader.get("/api/limits")).json()["limits"]
    assert [(x["limit_key"], x["paused"]) for x in listed] == [
        ("kind:command", True),
        ("tenant:acme", False),
    ]
    assert_problem(await reader.put("/api/limits/y", json={"max_running": 1}), 403)
    assert_problem(await reader.post("/api/kinds/command/resume"), 403)
    resumed = await admin.post("/api/kinds/command/resume")
    assert resumed.json() == {"kind": "command", "resumed": True}
    cleared = await admin.delete("/api/limits/tenant:acme")
    assert cleared.json() == {"limit_key": "tenant:acme", "removed": True}
    assert (await reader.get("/api/limits")).json()["limits"] == []


async def test_a_task_held_by_a_limit_says_so(client: httpx.AsyncClient, db: StateDB) -> None:
    r = await client.post("/api/tasks", json={**ECHO, "limit_key": "tenant:z"})
    await client.put("/api/limits/tenant:z", json={"max_running": 0})
    shown = (await client.get(f"/api/tasks/{r.json()['task_id']}")).json()
    assert shown["placement"]["reason"] == "held by limit tenant:z: paused (max_running 0)"
