"""The OpenAPI document names each typed kind's arguments (issue 29): ``TaskArgs.<kind>``, the
JSON Schema its ``@taskward.task`` function's type hints make, and HTTP admission refuses a
wrong type naming the argument (the same check as every binding's)."""

from __future__ import annotations

import httpx

from taskward.adapters import AdapterConfig, build_registry
from taskward.http import create_app
from taskward.store.port import StateDB
from taskward.web.config import HttpConfig

REGISTRY = build_registry(AdapterConfig(imports=("tests.fixtures.typed_tasks",)))


async def test_the_document_has_each_typed_kinds_arguments_and_http_checks_them(
    db: StateDB,
) -> None:
    app = create_app(db, REGISTRY, HttpConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        document = (await client.get("/openapi.json")).json()
        schemas = document["components"]["schemas"]
        weekly = schemas["TaskArgs.weekly"]
        assert weekly["properties"]["week"]["type"] == "integer"
        assert weekly["required"] == ["week"]
        assert "TaskArgs.loose" in schemas and "TaskArgs.command" not in schemas
        refused = await client.post(
            "/api/tasks",
            json={
                "action_kind": "weekly",
                "args": {"week": "x"},
                "execution_target": "host",
                "idempotency_key": "http-typed",
            },
        )
        assert refused.status_code == 422, refused.text
        assert "args.week" in refused.text
        accepted = await client.post(
            "/api/tasks",
            json={
                "action_kind": "weekly",
                "args": {"week": 7},
                "execution_target": "host",
                "idempotency_key": "http-typed",
            },
        )
        assert accepted.status_code == 201, accepted.text
