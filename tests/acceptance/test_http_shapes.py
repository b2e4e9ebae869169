"""The HTTP API's shapes (issue 28, item 3), on SQLite and PostgreSQL: a body sent without a
JSON Content-Type is a 415 saying so, an unknown field lists the allowed ones, a schedule is
created with the fields it is returned with (the earlier names deprecated), and every epoch time
has an ISO 8601 UTC twin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

import taskward
from taskward.http import HttpConfig, create_app
from taskward.store import StateDB

PROBLEM = "application/problem+json"
ECHO_ARGS = {"argv": ["echo", "hi"]}
TASK = {"action_kind": "command", "args": ECHO_ARGS, "idempotency_key": "shape-1"}


@pytest.fixture
async def client(db: StateDB) -> AsyncIterator[httpx.AsyncClient]:
    registry = taskward.build_registry(
        taskward.AdapterConfig(command_allowlist=frozenset({"echo"}))
    )
    app = create_app(db, registry, HttpConfig())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        yield http


async def task_count(db: StateDB) -> int:
    return len((await taskward.list_tasks(db, limit=100))[0])


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    return body


# -- Content-Type ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({}, "the request has no Content-Type header"),
        ({"Content-Type": "text/plain"}, "the request's Content-Type is 'text/plain'"),
        (
            {"Content-Type": "application/x-www-form-urlencoded"},
            "'application/x-www-form-urlencoded'",
        ),
    ],
)
async def test_a_body_without_a_json_content_type_is_a_415_saying_what_came(
    client: httpx.AsyncClient, db: StateDB, headers: dict[str, str], said: str
) -> None:
    import json

    r = await client.post("/api/tasks", content=json.dumps(TASK).encode(), headers=headers)
    body = problem(r, 415)
    assert body["type"].endswith("unsupported-media-type")
    assert body["field"] == "Content-Type"
    assert body["allowed"] == "application/json"
    assert "Content-Type: application/json" in body["detail"]
    assert said in body["detail"]
    assert "valid dictionary" not in body["detail"]
    assert await task_count(db) == 0


async def test_a_json_body_that_is_not_an_object_says_which_json_it_is(
    client: httpx.AsyncClient,
) -> None:
    body = problem(await client.post("/api/tasks", json=[TASK]), 422)
    assert body["field"] == "body"
    assert body["detail"] == "body: the body must be a JSON object, not a JSON array"


async def test_a_cancel_without_a_body_needs_no_content_type(client: httpx.AsyncClient) -> None:
    task_id = (await client.post("/api/tasks", json=TASK)).json()["task_id"]
    r = await client.post(f"/api/tasks/{task_id}/cancel")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled"


# -- unknown fields --------------------------------------------------------------------------


async def test_an_unknown_field_lists_the_fields_allowed(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    body = problem(await client.post("/api/tasks", json={**TASK, "urgency": 1}), 422)
    assert body["field"] == "urgency"
    assert "extra inputs" not in body["detail"].lower()
    assert body["detail"].startswith("urgency: unknown field; the fields allowed here are ")
    assert {"action_kind", "args", "idempotency_key", "depends_on"} <= set(body["allowed_fields"])
    assert "action_kind, args" in body["allowed"]
    assert await task_count(db) == 0

    cancel = problem(
        await client.post("/api/tasks/x/cancel", json={"reason": "r", "why": "not a field"}), 422
    )
    assert cancel["allowed_fields"] == ["idempotency_key", "reason"]

    schedule = problem(
        await client.post(
            "/api/schedules",
            json={"name": "s", "action_kind": "command", "interval_s": 60, "every": 1},
        ),
        422,
    )
    fields = schedule["allowed_fields"]
    assert {"cron_expression", "action_args", "anchor_at", "interval_s"} <= set(fields)
    assert not {"cron", "args", "start_at"} & set(fields)  # the deprecated names are not offered


# -- one shape for schedules -----------------------------------------------------------------


async def test_a_schedule_is_created_with_the_fields_it_is_returned_with(
    client: httpx.AsyncClient,
) -> None:
    sent = {
        "name": "nightly",
        "action_kind": "command",
        "action_args": ECHO_ARGS,
        "cron_expression": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "misfire_policy": "skip",
        "overlap_policy": "skip",
        "catch_up_max": 3,
        "misfire_grace_s": 30,
        "enabled": False,
    }
    created = await client.post("/api/schedules", json=sent)
    assert created.status_code == 201, created.text
    assert "deprecation" not in created.headers
    shown = (await client.get("/api/schedules/nightly")).json()
    for answer in (created.json(), shown):
        assert {name: answer[name] for name in sent} == sent  # every field, under its own name

    interval = {
        "name": "anchored",
        "action_kind": "command",
        "action_args": ECHO_ARGS,
        "interval_s": 600,
        "anchor_at": 1_900_000_000,
    }
    row = (await client.post("/api/schedules", json=interval)).json()
    assert {name: row[name] for name in interval} == interval


async def test_the_earlier_schedule_names_still_work_with_a_deprecation_header(
    client: httpx.AsyncClient,
) -> None:
    old = {
        "name": "legacy",
        "action_kind": "command",
        "args": ECHO_ARGS,
        "cron": "*/5 * * * *",
    }
    created = await client.post("/api/schedules", json=old)
    assert created.status_code == 201, created.text
    assert created.headers["deprecation"] == "true"
    row = created.json()
    assert (row["cron_expression"], row["action_args"]) == ("*/5 * * * *", ECHO_ARGS)
    assert "cron" not in row and "args" not in row

    both = problem(
        await client.post(
            "/api/schedules",
            json={**old, "name": "twice", "cron_expression": "*/5 * * * *"},
        ),
        422,
    )
    assert both["field"] == "cron_expression"
    assert "deprecated" in both["detail"]


async def test_a_schedule_error_names_the_field_the_body_used(client: httpx.AsyncClient) -> None:
    base = {"name": "bad", "action_kind": "command"}
    new = problem(
        await client.post(
            "/api/schedules",
            json={**base, "cron_expression": "61 * * * *", "action_args": ECHO_ARGS},
        ),
        422,
    )
    assert new["field"] == "cron_expression"
    assert new["detail"].startswith("cron_expression ")
    args = problem(
        await client.post(
            "/api/schedules",
            json={**base, "interval_s": 60, "action_args": {"argv": ["rm", "-rf", "/"]}},
        ),
        422,
    )
    assert args["field"] == "action_args.argv[0]"
    old = problem(
        await client.post("/api/schedules", json={**base, "cron": "61 * * * *"}),
        422,
    )
    assert old["field"] == "cron"  # a body with the old name is answered in its terms


# -- ISO 8601 twins --------------------------------------------------------------------------


def iso_of(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def assert_twins(row: dict[str, Any]) -> None:
    times = [k for k in row if (k.endswith("_at") or k == "run_after")]
    assert times, row
    for name in times:
        value = row[name]
        twin = row[f"{name}_iso"]
        if value is None:
            assert twin is None, name
        else:
            assert isinstance(value, int | float), name  # the epoch field stays a number
            assert twin == iso_of(value), name
            assert datetime.fromisoformat(twin.replace("Z", "+00:00")).timestamp() == (
                pytest.approx(value, abs=0.001)
            )


async def test_every_epoch_time_has_an_iso_8601_utc_twin(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    args = {"argv": ["echo", "x"], "start_at": 5, "nested": {"created_at": 7}}
    task_id = (await client.post("/api/tasks", json={**TASK, "args": args})).json()["task_id"]
    await client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "shape test"})

    row = (await client.get(f"/api/tasks/{task_id}")).json()
    assert_twins(row)
    assert row["created_at_iso"].endswith("Z") and "T" in row["created_at_iso"]
    assert row["action_args"] == args  # the caller's data is never given twins

    listed = (await client.get("/api/tasks")).json()["tasks"]
    assert listed and all(assert_twins(r) is None for r in listed)
    transitions = (await client.get(f"/api/tasks/{task_id}/transitions")).json()["transitions"]
    assert transitions and all(assert_twins(r) is None for r in transitions)

    await client.post(
        "/api/schedules",
        json={"name": "t", "action_kind": "command", "interval_s": 60, "action_args": ECHO_ARGS},
    )
    for schedule in (await client.get("/api/schedules")).json()["schedules"]:
        assert_twins(schedule)
        assert isinstance(schedule["next_fire_at_iso"], str)


async def test_the_openapi_document_has_the_new_shapes(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    submit = doc["paths"]["/api/tasks"]["post"]["responses"]
    assert "415" in submit and PROBLEM in submit["415"]["content"]
    schemas = doc["components"]["schemas"]
    create = schemas["ScheduleCreate"]["properties"]
    assert "cron_expression" in create and "action_args" in create and "anchor_at" in create
    assert all(create[old].get("deprecated") is True for old in ("cron", "args", "start_at"))
    assert "created_at_iso" in schemas["TaskOut"]["properties"]
    assert "next_fire_at_iso" in schemas["ScheduleOut"]["properties"]
