"""Stored results (DESIGN.md R22) through every binding, on SQLite and PostgreSQL: the CLI's
``task wait --result`` (in-process, ``clirun``), ``GET /api/tasks/{id}/result`` and its
OpenAPI entry, and the dashboard's task page (httpx against the ASGI app)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.cli.errors import EXIT_FAILURE, EXIT_OK
from taskward.dashboard.resultview import RESULT_PREVIEW_BYTES
from taskward.http import HttpConfig, create_app
from taskward.store import StateDB
from tests.acceptance.clirun import Run, run_cli

MODULE = "tests.fixtures.result_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,), python_modules=frozenset({MODULE})))
PROBLEM = "application/problem+json"


async def ran(db: StateDB, kind: str, args: dict[str, Any]) -> str:
    """A task of ``kind`` admitted and run to its end by one worker call."""
    app = taskward.TaskApplication(
        action_kind=kind, args=args, execution_target="host", idempotency_key=str(uuid.uuid4())
    )
    task_id = await taskward.submit_task(db, app, registry=REGISTRY)
    await taskward.claim_and_execute(db, worker_id="host:results", registry=REGISTRY)
    return task_id


async def queued(db: StateDB) -> str:
    app = taskward.TaskApplication(
        action_kind="give", args={"value": 1}, execution_target="host", idempotency_key="q"
    )
    return await taskward.submit_task(db, app, registry=REGISTRY)


def cli(db_url: str, tmp_path: Path, *args: str) -> Run:
    return run_cli(db_url, *args, cwd=tmp_path)


async def test_task_wait_result_prints_the_stored_json(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    value = {"rows": [1, 2], "name": "é"}
    done = await ran(db, "give", {"value": value})
    nothing = await ran(db, "nothing", {})
    failed = await ran(db, "give_set", {"items": [1]})

    shown = cli(db_url, tmp_path, "task", "wait", done, "--result")
    assert shown.returncode == EXIT_OK, shown.stderr
    assert json.loads(shown.stdout) == value  # stdout is the result alone, ready for a pipe
    assert "completed" in shown.stderr

    as_json = cli(db_url, tmp_path, "task", "wait", done, "--result", "--json")
    answer = json.loads(as_json.stdout)
    assert (answer["status"], answer["result"]) == ("completed", value)

    assert json.loads(cli(db_url, tmp_path, "task", "wait", nothing, "--result").stdout) is None

    # a task that did not complete: the existing output and exit code, no result
    lost = cli(db_url, tmp_path, "task", "wait", failed, "--result")
    assert lost.returncode == EXIT_FAILURE
    assert lost.stdout.strip() == "failed"
    assert "reason: result_not_serializable" in lost.stderr  # why, on stderr
    plain = cli(db_url, tmp_path, "task", "wait", done)
    assert (plain.returncode, plain.stdout.strip()) == (EXIT_OK, "completed")


@pytest.fixture
async def client(db: StateDB) -> Any:
    app = create_app(db, REGISTRY, HttpConfig())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        yield http


async def test_the_result_route_answers_200_404_and_409(
    db: StateDB, client: httpx.AsyncClient
) -> None:
    done = await ran(db, "give", {"value": [1, {"a": None}]})
    waiting = await queued(db)

    ok = await client.get(f"/api/tasks/{done}/result")
    assert ok.status_code == 200
    assert ok.json() == {"task_id": done, "attempt": 1, "result": [1, {"a": None}]}

    missing = await client.get("/api/tasks/no-such-task/result")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith(PROBLEM)

    early = await client.get(f"/api/tasks/{waiting}/result")
    assert early.status_code == 409
    assert early.headers["content-type"].startswith(PROBLEM)
    problem = early.json()
    assert problem["type"].endswith("not-completed")
    assert (problem["task_id"], problem["task_status"], problem["status"]) == (
        waiting,
        "queued",
        409,
    )

    openapi = (await client.get("/openapi.json")).json()
    operation = openapi["paths"]["/api/tasks/{task_id}/result"]["get"]
    assert {"200", "404", "409"} <= set(operation["responses"])


async def test_the_task_page_shows_the_result_cut_with_a_link_to_the_whole(
    db: StateDB, client: httpx.AsyncClient
) -> None:
    small = await ran(db, "give", {"value": {"answer": 42}})
    big = await ran(db, "give_text", {"size": 3 * RESULT_PREVIEW_BYTES})
    waiting = await queued(db)

    page = (await client.get(f"/tasks/{small}")).text
    assert 'data-region="result-section"' in page
    assert "&#34;answer&#34;: 42" in page or '"answer": 42' in page

    regions = (await client.get(f"/ui/data/tasks/{big}")).json()["regions"]
    assert regions["result-section"]["visible"] is True
    shown = regions["result"]["text"]
    assert len(shown.encode()) < RESULT_PREVIEW_BYTES + 100
    assert f"cut at {RESULT_PREVIEW_BYTES} of {3 * RESULT_PREVIEW_BYTES + 2} bytes" in shown
    href = regions["result-link"]["href"]
    whole = await client.get(href)
    assert whole.status_code == 200
    assert whole.json()["result"] == "x" * (3 * RESULT_PREVIEW_BYTES)

    hidden = (await client.get(f"/ui/data/tasks/{waiting}")).json()["regions"]
    assert hidden["result-section"]["visible"] is False
    assert (await client.get(f"/ui/data/tasks/{waiting}/result")).status_code == 409
