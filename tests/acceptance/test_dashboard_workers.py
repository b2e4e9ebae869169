"""The dashboard's workers page (issue 28): stopped workers grey, stale ones red, every lease a
worker holds linked to its task, and a CSRF-protected "prune" for a stopped or stale worker.
Over ASGI on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

import taskward
from taskward.archive import archive_runs
from taskward.claims import WorkerSpec, claim_runs
from taskward.heartbeat import mark_worker_stopped
from taskward.http import HttpConfig, create_app
from taskward.outbox import OutboxDeliverer
from taskward.reads import list_workers
from taskward.store import StateDB
from tests.integration.helpers import REGISTRY, move, submit

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')


@pytest.fixture
async def client(db: StateDB) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(db, REGISTRY, HttpConfig())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        yield client


async def test_states_leases_and_prune(client: httpx.AsyncClient, db: StateDB) -> None:
    ttl = HttpConfig().heartbeat_ttl_s
    tasks = {await submit(db) for _ in range(3)}
    now = await db.now()
    await taskward.register_heartbeat(db, worker_id="w-busy", now=now)
    leases = await claim_runs(db, WorkerSpec("w-busy", REGISTRY.kinds()), limit=3, now=now)
    assert {x.task_id for x in leases} == tasks
    await taskward.register_heartbeat(db, worker_id="w-crashed", now=now - ttl - 100)
    await taskward.register_heartbeat(db, worker_id="w-done", now=now - 5)
    await mark_worker_stopped(db, worker_id="w-done", now=now - 4)

    page = await client.get("/workers")
    assert page.status_code == 200
    for task_id in tasks:  # every lease, each a link
        assert f'<a href="/tasks/{task_id}">{task_id}</a>' in page.text
    assert '<td class="worker-stopped">stopped</td>' in page.text
    assert '<td class="worker-stale">stale</td>' in page.text
    assert '<td class="worker-live">live</td>' in page.text
    assert page.text.count('action="/workers/') == 2  # the live one has no prune button
    data = (await client.get("/ui/data/workers")).json()["regions"]
    rows = {row[0]["text"]: row for row in data["workers"]["rows"]}
    assert [link["text"] for link in rows["w-busy"][3]["links"]] == sorted(tasks)
    assert rows["w-done"][1] == {"text": "stopped", "cls": "worker-stopped"}
    assert data["workers-summary"]["text"] == "1 live of 3 (1 stale, 1 stopped)"

    # Without the CSRF token nothing happens; with it the stopped worker goes.
    refused = await client.post("/workers/w-done/prune", data={})
    assert refused.status_code == 403
    csrf = CSRF_META.search(page.text)
    assert csrf
    done = await client.post("/workers/w-done/prune", data={"csrf_token": csrf.group(1)})
    assert done.status_code == 303 and done.headers["location"] == "/workers"
    live = await client.post("/workers/w-busy/prune", data={"csrf_token": csrf.group(1)})
    assert live.status_code == 422
    crashed = await client.post("/workers/w-crashed/prune", data={"csrf_token": csrf.group(1)})
    assert crashed.status_code == 303
    left = await list_workers(db, heartbeat_ttl=ttl)
    assert [w["worker_id"] for w in left] == ["w-busy"]


async def test_an_archived_task_page_and_api_still_answer(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    old = await db.now() - 40 * 86400
    task_id = await submit(db, now=old)
    await move(db, task_id, "queued", "cancelled", now=old + 1)
    async with OutboxDeliverer(db) as deliverer:
        await deliverer.run_once(now=old + 8 * 86400)
    assert (await archive_runs(db, older_than_s=86400)).archived == 1
    page = await client.get(f"/tasks/{task_id}")
    assert page.status_code == 200 and "cancelled" in page.text
    got = (await client.get(f"/api/tasks/{task_id}")).json()
    assert got["archived"] is True and got["status"] == "cancelled"
    facts = (await client.get(f"/api/tasks/{task_id}/transitions")).json()["transitions"]
    assert [f["status"] for f in facts] == ["cancelled"]
