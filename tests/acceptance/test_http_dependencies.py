"""Dependencies (DESIGN.md R21) over HTTP, on both backends: ``depends_on`` in the submission
body and ``GET /api/tasks/{id}/dependencies``, as a client drives them (httpx against the ASGI
app)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import taskward
from taskward.fields import MAX_DEPENDENCIES
from taskward.http import HttpConfig
from taskward.store import StateDB
from tests.acceptance.test_http_api import READER, SUBMITTER, TOKENS, Client, assert_problem, rows
from tests.acceptance.test_http_api import make_client as make_client
from tests.integration.helpers import move

ECHO = {"action_kind": "command", "args": {"argv": ["echo", "hi"]}}


@pytest.fixture
def client(make_client: Client) -> httpx.AsyncClient:
    return make_client()


async def submit(client: httpx.AsyncClient, key: str, **fields: Any) -> str:
    r = await client.post("/api/tasks", json={**ECHO, "idempotency_key": key, **fields})
    assert r.status_code == 201, r.text
    task_id: str = r.json()["task_id"]
    return task_id


async def test_depends_on_admits_a_waiting_task_and_both_ends_list_the_link(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    a = await submit(client, "a")
    b = await submit(client, "b")
    c = await submit(client, "c", depends_on=[b, a, b])
    row = await taskward.get_task(db, c)
    assert (row["status"], row["status_reason_code"]) == (
        "waiting_dependency",
        "dependencies_pending",
    )
    again = await client.post(
        "/api/tasks", json={**ECHO, "idempotency_key": "c", "depends_on": [a, b]}
    )
    assert again.status_code == 200 and again.json()["task_id"] == c  # sorted, de-duplicated
    conflict = await client.post(
        "/api/tasks", json={**ECHO, "idempotency_key": "c", "depends_on": [a]}
    )
    assert assert_problem(conflict, 409)["existing_task_id"] == c

    links = (await client.get(f"/api/tasks/{c}/dependencies")).json()
    assert links["task_id"] == c and links["children"] == []
    assert sorted(p["id"] for p in links["parents"]) == sorted([a, b])
    parent = next(p for p in links["parents"] if p["id"] == a)
    assert parent["status"] == "queued" and parent["idempotency_key"] == "a"
    assert parent["action_kind"] == "command" and parent["ended_at"] is None
    of_a = (await client.get(f"/api/tasks/{a}/dependencies")).json()
    assert [x["id"] for x in of_a["children"]] == [c] and of_a["parents"] == []
    assert of_a["children"][0]["status"] == "waiting_dependency"


async def test_a_completed_dependency_admits_queued_and_a_failed_one_skipped(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    done = await submit(client, "done")
    await move(db, done, "queued", "running", "completed")
    failed = await submit(client, "failed")
    await move(db, failed, "queued", "running", "failed")
    ready = await submit(client, "ready", depends_on=[done])
    assert (await client.get(f"/api/tasks/{ready}")).json()["status"] == "queued"
    skipped = await submit(client, "skipped", depends_on=[done, failed])
    shown = (await client.get(f"/api/tasks/{skipped}")).json()
    assert (shown["status"], shown["status_reason_code"]) == ("skipped", "dependency_failed")
    parents = (await client.get(f"/api/tasks/{skipped}/dependencies")).json()["parents"]
    assert {p["id"]: p["status"] for p in parents} == {done: "completed", failed: "failed"}


async def test_missing_dependencies_are_a_422_listing_them_and_nothing_is_stored(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    real = await submit(client, "real")
    r = await client.post("/api/tasks", json={**ECHO, "depends_on": [real, "nope-2", "nope-1"]})
    problem = assert_problem(r, 422)
    assert problem["field"] == "depends_on"
    assert problem["value"] == ["nope-1", "nope-2"]
    assert "nope-1, nope-2" in problem["detail"]
    assert await rows(db) == 1
    assert (await client.get(f"/api/tasks/{real}/dependencies")).json()["children"] == []


@pytest.mark.parametrize(
    "value",
    [
        "not-a-list",
        [7],
        [""],
        [" padded "],
        ["x" * 65],
        [f"id-{i}" for i in range(MAX_DEPENDENCIES + 1)],
    ],
)
async def test_a_bad_depends_on_is_a_422_naming_the_field(
    client: httpx.AsyncClient, db: StateDB, value: object
) -> None:
    problem = assert_problem(
        await client.post("/api/tasks", json={**ECHO, "depends_on": value}), 422
    )
    assert problem["field"].split(".")[0] == "depends_on", problem
    assert await rows(db) == 0


async def test_dependencies_of_an_unknown_task_are_a_404(client: httpx.AsyncClient) -> None:
    for task_id in ("nope", "x" * 300):
        problem = assert_problem(await client.get(f"/api/tasks/{task_id}/dependencies"), 404)
        assert problem["type"].endswith(":not-found")


async def test_dependencies_need_the_read_scope(make_client: Client, db: StateDB) -> None:
    config = HttpConfig(tokens=TOKENS)
    bot = make_client(config, token=SUBMITTER)
    a = await submit(bot, "a")
    assert_problem(await make_client(config).get(f"/api/tasks/{a}/dependencies"), 401)
    reader = make_client(config, token=READER)
    assert (await reader.get(f"/api/tasks/{a}/dependencies")).status_code == 200
    assert_problem(
        await reader.post("/api/tasks", json={**ECHO, "depends_on": [a]}), 403
    )  # submitting with depends_on is submitting


async def test_the_openapi_document_has_the_field_and_the_route(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    submission = doc["components"]["schemas"]["TaskSubmission"]["properties"]["depends_on"]
    assert submission["type"] == "array" and submission["items"] == {"type": "string"}
    route = doc["paths"]["/api/tasks/{task_id}/dependencies"]["get"]
    assert route["operationId"] == "get_task_dependencies"
    assert route["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Dependencies"
    }
    assert "application/problem+json" in route["responses"]["404"]["content"]
