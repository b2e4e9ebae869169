"""The HTTP API as a client drives it: httpx against the ASGI app, on SQLite and PostgreSQL.

Every route goes through the same library functions as the CLI; these tests check the HTTP
contract on top: status codes, problem documents, headers, generated keys, cursor paging,
scopes, the actor a token records, the body limit, the store being away, the dashboard's
CSRF-protected cancel, and ``taskward serve``/``up`` as processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import taskward
from taskward.cli.errors import EXIT_BAD_INPUT
from taskward.cli.main import main as cli_main
from taskward.http import HttpConfig, create_app
from taskward.outbox import DEFAULT_MAX_ATTEMPTS, DeliveryFailed, OutboxConfig, OutboxDeliverer
from taskward.reads import count_by_status
from taskward.store import StateDB
from taskward.web.config import ApiToken, parse_tokens

PROBLEM = "application/problem+json"
GENERATED = re.compile(r"^http:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ECHO = {"action_kind": "command", "args": {"argv": ["echo", "hi"]}}

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
SUBMITTER = "submit-token-0123456789"
TOKENS = parse_tokens([f"alice:{ADMIN}:*", f"reader:{READER}:read", f"bot:{SUBMITTER}:submit+read"])

Client = Callable[..., httpx.AsyncClient]


def registry() -> taskward.TaskAdapterRegistry:
    return taskward.build_registry(taskward.AdapterConfig(command_allowlist=frozenset({"echo"})))


@pytest.fixture
async def make_client(db: StateDB) -> AsyncIterator[Client]:
    """``make_client(config=..., token=...)``: an httpx client on a fresh app over ``db``."""
    clients: list[httpx.AsyncClient] = []

    def make(
        config: HttpConfig | None = None, token: str | None = None, **kwargs: Any
    ) -> httpx.AsyncClient:
        app = create_app(db, registry(), config or HttpConfig())
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        kwargs.setdefault("base_url", "http://localhost")
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), headers=headers, **kwargs
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def client(make_client: Client) -> httpx.AsyncClient:
    return make_client()


async def rows(db: StateDB) -> int:
    return sum((await count_by_status(db)).values())


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"].startswith("urn:taskward:problem:")
    assert body["title"] and body["detail"]
    return body


# -- POST /api/tasks ----------------------------------------------------------------------


async def test_a_new_task_is_201_with_its_location_and_key(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    r = await client.post("/api/tasks", json={**ECHO, "idempotency_key": "k-new"})
    assert r.status_code == 201
    body = r.json()
    assert body == {
        "task_id": body["task_id"],
        "idempotency_key": "k-new",
        "key_generated": False,
        "created": True,
    }
    assert r.headers["location"] == f"/api/tasks/{body['task_id']}"
    assert r.headers["idempotency-key"] == "k-new"
    row = await taskward.get_task(db, body["task_id"])
    assert row["admission_source"] == "http"
    assert row["status"] == "queued"


async def test_the_same_key_and_payload_is_200_with_the_original_id(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    first = await client.post("/api/tasks", json=ECHO, headers={"Idempotency-Key": "k-same"})
    again = await client.post("/api/tasks", json={**ECHO, "idempotency_key": "k-same"})
    both = await client.post(
        "/api/tasks",
        json={**ECHO, "idempotency_key": "k-same"},
        headers={"Idempotency-Key": "k-same"},
    )
    assert first.status_code == 201
    assert again.status_code == 200 and both.status_code == 200
    assert again.json()["task_id"] == both.json()["task_id"] == first.json()["task_id"]
    assert again.json()["created"] is False
    assert await rows(db) == 1


async def test_a_conflicting_payload_is_409_with_the_existing_id_and_writes_nothing(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    first = await client.post("/api/tasks", json={**ECHO, "idempotency_key": "k-c"})
    other = {"action_kind": "command", "args": {"argv": ["echo", "other"]}}
    r = await client.post("/api/tasks", json={**other, "idempotency_key": "k-c"})
    body = assert_problem(r, 409)
    assert body["existing_task_id"] == first.json()["task_id"]
    assert body["idempotency_key"] == "k-c"
    assert await rows(db) == 1
    row = await taskward.get_task(db, first.json()["task_id"])
    assert row["action_args"] == ECHO["args"]


async def test_without_a_key_one_is_generated_and_returned(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    r = await client.post("/api/tasks", json=ECHO)
    assert r.status_code == 201
    body = r.json()
    assert body["key_generated"] is True
    assert GENERATED.match(body["idempotency_key"])
    assert r.headers["idempotency-key"] == body["idempotency_key"]
    row = await taskward.get_task(db, body["task_id"])
    assert row["idempotency_key"] == body["idempotency_key"]
    # A second keyless submission is new work: only a client-chosen key makes retries safe.
    r2 = await client.post("/api/tasks", json=ECHO)
    assert r2.status_code == 201 and r2.json()["task_id"] != body["task_id"]


async def test_different_keys_in_body_and_header_are_422_and_store_nothing(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    r = await client.post(
        "/api/tasks",
        json={**ECHO, "idempotency_key": "body-key"},
        headers={"Idempotency-Key": "header-key"},
    )
    body = assert_problem(r, 422)
    assert body["field"] == "idempotency_key"
    assert "header" in body["allowed"]
    assert await rows(db) == 0


INVALID: list[tuple[str, Any, str, str]] = [
    # (case, JSON body or raw bytes, field named, text in allowed)
    ("unknown kind", {"action_kind": "shel", "args": {}}, "action_kind", "command"),
    ("bad target", {**ECHO, "execution_target": "moon"}, "execution_target", "daytona"),
    ("args not an object", {"action_kind": "command", "args": [1]}, "args", "dictionary"),
    ("kind not a string", {"action_kind": 3}, "action_kind", "string"),
    ("unknown field", {**ECHO, "urgency": 1}, "urgency", "idempotency_key, required_capabilities"),
    ("empty key", {**ECHO, "idempotency_key": "  "}, "idempotency_key", "non-empty"),
    ("command not allowed", {"action_kind": "command", "args": {"argv": ["rm"]}}, "args", ""),
    ("NaN in args", b'{"action_kind": "command", "args": {"x": NaN}}', "args", "JSON"),
    ("NUL in args", {"action_kind": "command", "args": {"argv": ["echo", "a\x00"]}}, "args", "NUL"),
    ("NUL in a key", {**ECHO, "idempotency_key": "k\x00"}, "idempotency_key", "NUL"),
    ("lone surrogate", b'{"action_kind": "command", "args": {"s": "\\ud800"}}', "args", "Unicode"),
    ("not JSON", b"{not json", "body", ""),
    ("not UTF-8", b'{"action_kind": "\xff"}', "body", "UTF-8"),
    ("missing body", b"", "body", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "payload", "field", "allowed"), INVALID, ids=[c[0] for c in INVALID]
)
async def test_invalid_input_is_a_422_problem_naming_the_field_and_stores_nothing(
    client: httpx.AsyncClient,
    db: StateDB,
    case: str,
    payload: Any,
    field: str,
    allowed: str,
) -> None:
    if isinstance(payload, bytes):
        r = await client.post(
            "/api/tasks", content=payload, headers={"Content-Type": "application/json"}
        )
    else:
        r = await client.post("/api/tasks", json=payload)
    body = assert_problem(r, 422)
    assert body["field"].startswith(field), body
    assert allowed.lower() in str(body["allowed"]).lower(), body
    assert await rows(db) == 0


async def test_a_body_over_the_limit_is_413_before_it_is_parsed(
    make_client: Client, db: StateDB
) -> None:
    client = make_client(HttpConfig(max_body_bytes=1000))
    big = {**ECHO, "args": {"argv": ["echo", "x" * 2000]}}
    body = assert_problem(await client.post("/api/tasks", json=big), 413)
    assert body["max_body_bytes"] == 1000

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        for _ in range(20):
            yield b" " * 100

    streamed = await client.post(
        "/api/tasks", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_problem(streamed, 413)
    # The default limit is 1 MiB.
    default = make_client()
    huge = b'{"action_kind": "command", "args": {"pad": "' + b"x" * (1024 * 1024) + b'"}}'
    assert_problem(
        await default.post(
            "/api/tasks", content=huge, headers={"Content-Type": "application/json"}
        ),
        413,
    )
    assert await rows(db) == 0


async def test_a_cross_site_post_is_refused(client: httpx.AsyncClient, db: StateDB) -> None:
    r = await client.post("/api/tasks", json=ECHO, headers={"Origin": "https://evil.example"})
    assert_problem(r, 403)
    r = await client.post("/api/tasks", json=ECHO, headers={"Sec-Fetch-Site": "cross-site"})
    assert_problem(r, 403)
    same = await client.post("/api/tasks", json=ECHO, headers={"Origin": "http://localhost"})
    assert same.status_code == 201
    assert await rows(db) == 1


async def test_without_tokens_only_loopback_host_names_are_served(make_client: Client) -> None:
    rebound = make_client(base_url="http://attacker.example")
    body = assert_problem(await rebound.get("/api/tasks"), 400)
    assert "127.0.0.1" in body["detail"]
    assert (
        await make_client(base_url="http://127.0.0.1:8080").get("/api/tasks")
    ).status_code == 200


# -- reads --------------------------------------------------------------------------------


async def test_listing_filters_and_pages_with_a_cursor(client: httpx.AsyncClient) -> None:
    ids = []
    for i in range(5):
        target = "host" if i % 2 == 0 else "daytona"
        payload = {"action_kind": "command", "args": {"argv": ["echo", str(i)]}}
        r = await client.post("/api/tasks", json={**payload, "execution_target": target})
        ids.append(r.json()["task_id"])
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/api/tasks", params=params)).json()
        seen.extend(t["id"] for t in page["tasks"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(ids))  # newest first, each exactly once
    daytona = (await client.get("/api/tasks", params={"target": "daytona"})).json()["tasks"]
    assert {t["id"] for t in daytona} == {ids[1], ids[3]}
    queued = (await client.get("/api/tasks", params={"status": "queued", "kind": "command"})).json()
    assert len(queued["tasks"]) == 5
    assert (await client.get("/api/tasks", params={"status": "completed"})).json()["tasks"] == []
    assert_problem(await client.get("/api/tasks", params={"status": "done"}), 422)
    assert_problem(await client.get("/api/tasks", params={"limit": 0}), 422)
    assert_problem(await client.get("/api/tasks", params={"cursor": "garbage!"}), 422)


async def test_a_task_shows_its_row_and_why_it_waits(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/tasks", json={**ECHO, "execution_target": "daytona"})
    task = (await client.get(f"/api/tasks/{r.json()['task_id']}")).json()
    assert task["status"] == "queued"
    assert task["execution_target"] == "daytona"
    assert task["placement"]["claimable"] is False
    assert "no live worker" in task["placement"]["reason"]


async def test_an_unknown_task_is_a_404_problem(client: httpx.AsyncClient) -> None:
    for path in ("/api/tasks/nope", "/api/tasks/nope/transitions", "/api/tasks/a%00b"):
        body = assert_problem(await client.get(path), 404)
        assert body["type"] == "urn:taskward:problem:not-found"
    assert_problem(await client.post("/api/tasks/nope/cancel"), 404)


# -- cancel, transitions, actors ----------------------------------------------------------


async def test_cancel_records_the_token_name_as_the_actor(make_client: Client, db: StateDB) -> None:
    client = make_client(HttpConfig(tokens=TOKENS), token=ADMIN)
    task_id = (await client.post("/api/tasks", json=ECHO)).json()["task_id"]
    r = await client.post(
        f"/api/tasks/{task_id}/cancel", json={"idempotency_key": "c-1", "reason": "not needed"}
    )
    assert r.status_code == 200
    assert r.json() == {
        "task_id": task_id,
        "state": "cancelled",
        "current_status": "cancelled",
        "idempotency_key": "c-1",
        "key_generated": False,
    }
    assert r.headers["idempotency-key"] == "c-1"
    replay = await client.post(f"/api/tasks/{task_id}/cancel", headers={"Idempotency-Key": "c-1"})
    assert replay.json()["state"] == "cancelled"
    facts = (await client.get(f"/api/tasks/{task_id}/transitions")).json()["transitions"]
    assert [(f["previous_status"], f["status"]) for f in facts] == [("queued", "cancelled")]
    assert facts[0]["actor"] == "operator:alice"
    assert facts[0]["reason_summary"] == "not needed"
    later = await client.post(f"/api/tasks/{task_id}/cancel")
    assert later.json()["state"] == "already_terminal"
    assert GENERATED.match(later.json()["idempotency_key"])
    assert len(await taskward.list_transitions(db, task_id)) == 1


async def test_retry_runs_an_ended_task_again_and_needs_operate(
    make_client: Client, db: StateDB
) -> None:
    """``POST /api/tasks/{id}/retry`` (R19): 409 while the task has not ended; once it has, a
    new task with its application (201), the same key the same task, the token's name as the
    operator; a read-only token is refused."""
    client = make_client(HttpConfig(tokens=TOKENS), token=ADMIN)
    task_id = (await client.post("/api/tasks", json=ECHO)).json()["task_id"]
    body = assert_problem(
        await client.post(f"/api/tasks/{task_id}/retry", json={"idempotency_key": "r-1"}), 409
    )
    assert body["type"] == "urn:taskward:problem:not-retryable"
    await client.post(f"/api/tasks/{task_id}/cancel", json={"idempotency_key": "c"})
    r = await client.post(f"/api/tasks/{task_id}/retry", json={"idempotency_key": "r-1"})
    assert r.status_code == 201, r.text
    answer = r.json()
    assert answer["retry_of"] == task_id and answer["key_generated"] is False
    assert r.headers["idempotency-key"] == "r-1"
    new = (await client.get(f"/api/tasks/{answer['task_id']}")).json()
    assert new["status"] == "queued" and new["action_kind"] == ECHO["action_kind"]
    row = await db.fetchone("run_get", {"id": answer["task_id"]})
    assert row is not None and row["chain_parent_id"] == task_id
    assert row["trigger_context"]["actor"] == "operator:alice"
    again = await client.post(f"/api/tasks/{task_id}/retry", headers={"Idempotency-Key": "r-1"})
    assert again.json()["task_id"] == answer["task_id"]
    assert_problem(await client.post("/api/tasks/nope/retry"), 404)
    reader = make_client(HttpConfig(tokens=TOKENS), token=READER)
    assert_problem(await reader.post(f"/api/tasks/{task_id}/retry"), 403)


async def test_cancel_with_different_keys_in_body_and_header_is_422(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = (await client.post("/api/tasks", json=ECHO)).json()["task_id"]
    r = await client.post(
        f"/api/tasks/{task_id}/cancel",
        json={"idempotency_key": "a"},
        headers={"Idempotency-Key": "b"},
    )
    assert_problem(r, 422)
    assert (await taskward.get_task(db, task_id))["status"] == "queued"


# -- access -------------------------------------------------------------------------------


async def test_with_tokens_every_route_but_healthz_needs_one(make_client: Client) -> None:
    anonymous = make_client(HttpConfig(tokens=TOKENS))
    for method, path in [
        ("GET", "/api/tasks"),
        ("POST", "/api/tasks"),
        ("GET", "/api/tasks/x"),
        ("GET", "/api/tasks/x/transitions"),
        ("POST", "/api/tasks/x/cancel"),
        ("GET", "/api/workers"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ]:
        r = await anonymous.request(method, path, json=ECHO if method == "POST" else None)
        assert_problem(r, 401)
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert (await anonymous.get("/healthz")).status_code == 200
    wrong = make_client(HttpConfig(tokens=TOKENS), token="not-a-token-at-all-000")
    assert_problem(await wrong.get("/api/tasks"), 401)
    basic = make_client(HttpConfig(tokens=TOKENS))
    assert_problem(await basic.get("/api/tasks", headers={"Authorization": "Basic eDp5"}), 401)


async def test_scopes_separate_submitting_reading_and_operating(
    make_client: Client, db: StateDB
) -> None:
    config = HttpConfig(tokens=TOKENS)
    reader = make_client(config, token=READER)
    bot = make_client(config, token=SUBMITTER)
    body = assert_problem(await reader.post("/api/tasks", json=ECHO), 403)
    assert body["required_scope"] == "submit"
    assert await rows(db) == 0
    task_id = (await bot.post("/api/tasks", json=ECHO)).json()["task_id"]
    assert (await reader.get(f"/api/tasks/{task_id}")).status_code == 200
    assert (await reader.get("/metrics")).status_code == 200
    assert_problem(await bot.post(f"/api/tasks/{task_id}/cancel"), 403)
    assert_problem(await reader.post(f"/api/tasks/{task_id}/cancel"), 403)
    assert (await taskward.get_task(db, task_id))["status"] == "queued"


def test_token_configuration_is_validated() -> None:
    with pytest.raises(taskward.TaskValidationError, match="scopes"):
        parse_tokens(["a:0123456789abcdefgh:admin"])
    with pytest.raises(taskward.TaskValidationError, match="at least 16"):
        parse_tokens(["a:short:read"])
    with pytest.raises(taskward.TaskValidationError, match="unique"):
        parse_tokens(["a:0123456789abcdefgh:read", "a:0123456789abcdefgX:read"])
    config = HttpConfig.from_env({"TASKWARD_API_TOKENS": "ci:0123456789abcdefgh:submit+read"})
    assert config.tokens == (ApiToken("ci", "0123456789abcdefgh", frozenset({"submit", "read"})),)
    assert "0123456789abcdefgh" not in repr(config)


def test_serve_refuses_a_non_loopback_address_without_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TASKWARD_API_TOKENS", "TASKWARD_API_TOKENS_FILE"):
        monkeypatch.delenv(name, raising=False)
    for command in ("serve", "up"):
        assert cli_main([command, "--host", "0.0.0.0", "--port", "0"]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "refusing to listen on '0.0.0.0' without an API token" in err


# -- workers, health, metrics -------------------------------------------------------------


async def test_workers_show_heartbeat_age_and_leased_task(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = (await client.post("/api/tasks", json=ECHO)).json()["task_id"]
    now = await db.now()
    await taskward.register_heartbeat(db, worker_id="w-old", now=now - 1000)
    await taskward.register_heartbeat(db, worker_id="w-busy", now=now, leased_run_id=task_id)
    workers = {w["worker_id"]: w for w in (await client.get("/api/workers")).json()["workers"]}
    assert workers["w-busy"]["is_live"] is True
    assert workers["w-busy"]["leased_run_id"] == task_id
    assert 0 <= workers["w-busy"]["heartbeat_age_s"] < 60
    assert workers["w-old"]["is_live"] is False
    assert workers["w-old"]["heartbeat_age_s"] >= 999


async def test_healthz_checks_the_store(client: httpx.AsyncClient, db: StateDB) -> None:
    r = await client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "store": db.dialect}


async def test_metrics_are_prometheus_text_from_the_store(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = (await client.post("/api/tasks", json=ECHO)).json()["task_id"]
    await client.post("/api/tasks", json={**ECHO, "execution_target": "daytona"})
    await client.post("/api/tasks", json={"action_kind": "nope"})
    await client.post(f"/api/tasks/{task_id}/cancel")
    await taskward.register_heartbeat(db, worker_id="w1")
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    for family, kind in [
        ("taskward_tasks", "gauge"),
        ("taskward_queue_depth", "gauge"),
        ("taskward_admissions_total", "counter"),
        ("taskward_transitions_total", "counter"),
        ("taskward_lease_expiries_total", "counter"),
        ("taskward_workers_live", "gauge"),
        ("taskward_worker_heartbeat_age_seconds", "gauge"),
        ("taskward_execution_duration_seconds", "histogram"),
        ("taskward_http_admissions_total", "counter"),
    ]:
        assert f"# TYPE {family} {kind}\n" in text
    assert 'taskward_queue_depth{status="queued"} 1\n' in text
    assert 'taskward_queue_depth{status="cancelled"} 1\n' in text
    assert 'taskward_tasks{status="queued",execution_target="daytona"} 1\n' in text
    assert 'taskward_admissions_total{source="http"} 2\n' in text
    assert 'taskward_transitions_total{from="queued",to="cancelled",reason="cancelled"} 1\n' in text
    assert "taskward_lease_expiries_total 0\n" in text
    assert "taskward_workers_live 1\n" in text
    assert 'taskward_worker_heartbeat_age_seconds{worker_id="w1"}' in text
    assert 'taskward_http_admissions_total{outcome="created"} 2\n' in text
    assert 'taskward_http_admissions_total{outcome="rejected"} 1\n' in text


async def test_the_openapi_document_describes_the_api(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path in (
        "/api/tasks",
        "/api/tasks/{task_id}",
        "/api/tasks/{task_id}/transitions",
        "/api/tasks/{task_id}/cancel",
        "/api/workers",
        "/healthz",
        "/metrics",
    ):
        assert path in paths
    assert "409" in paths["/api/tasks"]["post"]["responses"]
    assert not any(p.startswith("/ui") or p == "/" for p in paths)
    # every route that checks a token documents the failed-authentication limit's answer
    for path, operations in paths.items():
        for method, operation in operations.items():
            if "401" in operation["responses"]:
                assert "429" in operation["responses"], (method, path)


# -- the store away -----------------------------------------------------------------------


async def test_a_dead_store_is_503_with_retry_after_and_nothing_is_a_500() -> None:
    url = "postgresql://postgres@127.0.0.1:1/taskward?open_timeout_s=0.3&migrate=false"
    app = create_app(url, registry(), HttpConfig())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        for method, path in [
            ("GET", "/healthz"),
            ("POST", "/api/tasks"),
            ("GET", "/api/tasks"),
            ("GET", "/metrics"),
        ]:
            r = await client.request(method, path, json=ECHO if method == "POST" else None)
            body = assert_problem(r, 503)
            assert r.headers["retry-after"] == "5"
            assert "store" in body["detail"].lower() or "postgres" in body["detail"].lower()


async def test_a_closed_store_is_503(db_url: str) -> None:
    db = await taskward.open_db(db_url)
    app = create_app(db, registry(), HttpConfig())
    await db.close()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as client:
        assert_problem(await client.get("/healthz"), 503)
        assert_problem(await client.post("/api/tasks", json=ECHO), 503)


# -- the dashboard ------------------------------------------------------------------------

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
CANCEL_KEY = re.compile(r'name="idempotency_key" value="([^"]+)"')


async def test_the_dashboard_escapes_task_data(client: httpx.AsyncClient) -> None:
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    task_id = (
        await client.post(
            "/api/tasks", json={"action_kind": "command", "args": {"argv": ["echo", evil]}}
        )
    ).json()["task_id"]
    page = await client.get(f"/tasks/{task_id}")
    assert page.status_code == 200
    assert "<script>alert" not in page.text and "<img src=x" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    data = (await client.get(f"/ui/data/tasks/{task_id}")).json()
    assert evil in data["regions"]["args"]["text"]  # JSON is drawn with textContent


async def test_cancel_from_the_page_needs_the_csrf_token(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = (await client.post("/api/tasks", json=ECHO)).json()["task_id"]
    page = await client.get(f"/tasks/{task_id}")
    csrf_match = CSRF_META.search(page.text)
    key_match = CANCEL_KEY.search(page.text)
    assert csrf_match and key_match
    csrf, key = csrf_match.group(1), key_match.group(1)
    forged = await client.post(f"/tasks/{task_id}/cancel", data={"idempotency_key": key})
    assert forged.status_code == 403
    stale = await client.post(
        f"/tasks/{task_id}/cancel", data={"csrf_token": "guess", "idempotency_key": key}
    )
    assert stale.status_code == 403
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    ok = await client.post(
        f"/tasks/{task_id}/cancel", data={"csrf_token": csrf, "idempotency_key": key}
    )
    assert ok.status_code == 303
    assert ok.headers["location"].startswith(f"/tasks/{task_id}")
    again = await client.post(  # a double submit is the same request
        f"/tasks/{task_id}/cancel", data={"csrf_token": csrf, "idempotency_key": key}
    )
    assert again.status_code == 303
    facts = await taskward.list_transitions(db, task_id)
    assert [f["status"] for f in facts] == ["cancelled"]
    assert facts[0]["actor"] == "operator:anonymous"


async def test_with_tokens_the_dashboard_needs_a_login_and_records_its_name(
    make_client: Client, db: StateDB
) -> None:
    api = make_client(HttpConfig(tokens=TOKENS, session_secret=b"s" * 32), token=SUBMITTER)
    task_id = (await api.post("/api/tasks", json=ECHO)).json()["task_id"]
    browser = make_client(HttpConfig(tokens=TOKENS, session_secret=b"s" * 32))
    r = await browser.get(f"/tasks/{task_id}")
    assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")
    assert (await browser.get("/ui/data/overview")).status_code == 401
    bad = await browser.post("/login", data={"token": "wrong-token-000000000", "next": "/"})
    assert bad.status_code == 401
    login = await browser.post("/login", data={"token": ADMIN, "next": f"/tasks/{task_id}"})
    assert login.status_code == 303 and login.headers["location"] == f"/tasks/{task_id}"
    page = await browser.get(f"/tasks/{task_id}")
    assert page.status_code == 200
    csrf = CSRF_META.search(page.text)
    assert csrf
    r = await browser.post(f"/tasks/{task_id}/cancel", data={"csrf_token": csrf.group(1)})
    assert r.status_code == 303
    facts = await taskward.list_transitions(db, task_id)
    assert facts[0]["actor"] == "operator:alice"
    # An open redirect is never followed after login.
    evil = await browser.post("/login", data={"token": ADMIN, "next": "//evil.example/x"})
    assert evil.headers["location"] == "/"


async def test_dashboard_pages_render(client: httpx.AsyncClient, db: StateDB) -> None:
    task_id = (await client.post("/api/tasks", json=ECHO)).json()["task_id"]
    await taskward.register_heartbeat(db, worker_id="w-dash", leased_run_id=task_id)
    for path in (
        "/",
        "/tasks",
        "/tasks?status=queued&target=host",
        "/workers",
        f"/tasks/{task_id}",
    ):
        r = await client.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"].startswith("text/html")
        assert 'src="/static/dashboard.js"' in r.text
    overview = (await client.get("/ui/data/overview")).json()["regions"]
    assert overview["counts"]["kind"] == "table"
    assert "w-dash" in json.dumps(overview["workers"])
    assert (await client.get("/tasks/nope")).status_code == 404
    assert (await client.get("/tasks?target=moon")).status_code == 422
    assert (await client.get("/static/dashboard.js")).status_code == 200


# -- serve and up as processes (SQLite only: one process per test) ------------------------


def _start(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskward.cli.main",
            "--db",
            f"sqlite:///{tmp_path / 'tw.db'}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**base_env, **(env or {})},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r"dashboard:\s+(http://\S+)/", line)
        if match:
            return proc, match.group(1)
    proc.kill()
    raise AssertionError(f"no dashboard line; stderr: {proc.communicate()[1]}")


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err


async def test_taskward_up_serves_runs_tasks_and_stops_cleanly(tmp_path: Path) -> None:
    proc, base = _start(["up", "--port", "0"], tmp_path)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            assert (await http.get("/healthz")).status_code == 200
            r = await http.post("/api/tasks", json={**ECHO, "idempotency_key": "first"})
            task_id = r.json()["task_id"]
            deadline = time.monotonic() + 20
            status = ""
            while time.monotonic() < deadline:
                status = (await http.get(f"/api/tasks/{task_id}")).json()["status"]
                if status == "completed":
                    break
                await asyncio.sleep(0.1)
            assert status == "completed"
            workers = (await http.get("/api/workers")).json()["workers"]
            assert any(w["is_live"] for w in workers)
            metrics = (await http.get("/metrics")).text
            assert 'taskward_execution_duration_seconds_count{outcome="completed"} 1' in metrics
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    assert "allows ALL" in err


async def test_taskward_serve_with_tokens_requires_them(tmp_path: Path) -> None:
    env = {"TASKWARD_API_TOKENS": f"alice:{ADMIN}:*", "TASKWARD_COMMAND_ALLOWLIST": "echo"}
    proc, base = _start(["serve", "--port", "0"], tmp_path, env)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            assert (await http.get("/api/tasks")).status_code == 401
            r = await http.post(
                "/api/tasks", json=ECHO, headers={"Authorization": f"Bearer {ADMIN}"}
            )
            assert r.status_code == 201
    finally:
        code, err = _stop(proc)
    assert code == 0, err


# -- schedules and the outbox -------------------------------------------------------------


async def test_schedules_are_created_listed_fired_toggled_and_removed(
    make_client: Client, db: StateDB
) -> None:
    config = HttpConfig(tokens=TOKENS)
    admin = make_client(config, token=ADMIN)
    reader = make_client(config, token=READER)
    spec = {
        "name": "hourly",
        "action_kind": ECHO["action_kind"],
        "action_args": ECHO["args"],
        "interval_s": 3600,
    }
    created = await admin.post("/api/schedules", json=spec)
    assert created.status_code == 201, created.text
    schedule = created.json()
    assert schedule["name"] == "hourly" and schedule["enabled"] is True
    assert isinstance(schedule["next_fire_at"], int)
    listed = (await reader.get("/api/schedules")).json()["schedules"]
    assert [s["id"] for s in listed] == [schedule["id"]]
    assert (await reader.get("/api/schedules/hourly")).json()["id"] == schedule["id"]
    assert_problem(await reader.post("/api/schedules/hourly/fire"), 403)

    fired = await admin.post("/api/schedules/hourly/fire")
    assert fired.status_code == 200, fired.text
    body = fired.json()
    assert body["key_generated"] is True
    assert body["idempotency_key"].startswith(f"manual:{schedule['id']}:")
    task = await taskward.get_task(db, body["task_id"])
    assert task["admission_source"] == "schedule" and task["schedule_id"] == schedule["id"]
    again = await admin.post(
        "/api/schedules/hourly/fire", headers={"Idempotency-Key": body["idempotency_key"]}
    )
    assert again.json()["task_id"] == body["task_id"]  # the same manual fire, retried safely
    assert_problem(
        await admin.post("/api/schedules/hourly/fire", json={"idempotency_key": "mine"}), 422
    )

    assert (await admin.post("/api/schedules/hourly/disable")).json()["enabled"] is False
    assert (await admin.post("/api/schedules/hourly/enable")).json()["enabled"] is True
    removed = await admin.post(f"/api/schedules/{schedule['id']}/remove")
    assert removed.json()["removed_at"] is not None
    assert_problem(await admin.post(f"/api/schedules/{schedule['id']}/fire"), 422)
    assert_problem(await admin.get("/api/schedules/nope"), 404)
    runs_before = await rows(db)
    bad = await admin.post("/api/schedules", json={**spec, "name": "bad", "interval_s": None})
    assert assert_problem(bad, 422)["field"] == "cron_expression"
    bad_cron = await admin.post(
        "/api/schedules",
        json={**spec, "name": "bad", "interval_s": None, "cron_expression": "61 * * * *"},
    )
    assert assert_problem(bad_cron, 422)["field"].startswith("cron_expression")
    assert await rows(db) == runs_before
    assert (
        len(
            (await admin.get("/api/schedules", params={"include_removed": True})).json()[
                "schedules"
            ]
        )
        == 1
    )


@dataclass
class _Refusing:
    """An outbox delivery target that always fails."""

    name: str = "refusing"
    timeout_s: float = 1.0

    async def deliver(self, payload: bytes, row: Any) -> None:
        raise DeliveryFailed("no")


async def test_the_outbox_lists_notifications_and_retries_dead_letters(
    make_client: Client, db: StateDB
) -> None:
    config = HttpConfig(tokens=TOKENS)
    admin = make_client(config, token=ADMIN)
    task_id = (await admin.post("/api/tasks", json=ECHO)).json()["task_id"]
    await admin.post(f"/api/tasks/{task_id}/cancel")  # a terminal transition notifies
    page = (await admin.get("/api/outbox", params={"task_id": task_id})).json()
    assert [n["schedule_run_id"] for n in page["notifications"]] == [task_id]
    assert page["counts"]["pending"] == 1
    notification = page["notifications"][0]
    assert (await admin.get(f"/api/outbox/{notification['id']}")).json()["status"] == "pending"
    body = assert_problem(await admin.post(f"/api/outbox/{notification['id']}/retry"), 409)
    assert body["notification_id"] == notification["id"]
    assert_problem(await admin.get("/api/outbox/nope"), 404)
    assert_problem(await admin.get("/api/outbox", params={"status": "lost"}), 422)

    deliverer = OutboxDeliverer(db, OutboxConfig(targets=(_Refusing(),)), owner="test")
    now = await db.now()
    for i in range(DEFAULT_MAX_ATTEMPTS + 1):
        await deliverer.run_once(now=now + 4000 * i)
    assert (await admin.get(f"/api/outbox/{notification['id']}")).json()["status"] == "dead_letter"
    reader = make_client(config, token=READER)
    assert_problem(await reader.post(f"/api/outbox/{notification['id']}/retry"), 403)
    retried = await admin.post(f"/api/outbox/{notification['id']}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"
    assert (await taskward.get_task(db, task_id))["status"] == "cancelled"
    metrics = (await admin.get("/metrics")).text
    assert 'taskward_outbox_notifications{status="pending"} 1\n' in metrics
    assert 'taskward_schedules{state="all"} 0\n' in metrics


async def test_schedules_and_outbox_panels_render_and_operate(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    await client.post("/api/schedules", json={"name": "<b>daily</b>", **ECHO, "interval_s": 86400})
    page = await client.get("/schedules")
    assert page.status_code == 200
    assert "&lt;b&gt;daily&lt;/b&gt;" in page.text and "<b>daily</b>" not in page.text
    csrf = CSRF_META.search(page.text)
    action = re.search(r'action="(/schedules/[^"]+/fire)"', page.text)
    assert csrf and action
    assert (await client.post(action.group(1), data={})).status_code == 403
    fired = await client.post(action.group(1), data={"csrf_token": csrf.group(1)})
    assert fired.status_code == 303 and fired.headers["location"].startswith("/tasks/")
    assert (await rows(db)) == 1
    outbox = await client.get("/outbox")
    assert outbox.status_code == 200
    data = (await client.get("/ui/data/outbox")).json()["regions"]
    assert {"outbox", "outbox-counts", "next"} <= set(data)
