"""Text the store cannot hold, and unbounded input, through every binding: a clean 422 (CLI
exit 2, a dashboard message), never a 500, a dropped connection or a traceback.

A lone surrogate (``"x\\ud800"`` in JSON; a shell argument that is not UTF-8, which Python
decodes with surrogateescape) or a NUL in any text field used to pass validation, echo itself
into a problem document that could not be encoded, and fail in SQLite's driver. Each case
here runs on SQLite and PostgreSQL and checks that nothing was stored.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import taskward
from taskward.admission import MAX_CAPABILITIES, MAX_CAPABILITY_LENGTH
from taskward.cli.errors import EXIT_BAD_INPUT
from taskward.http import HttpConfig, create_app
from taskward.reads import count_by_status
from taskward.schedules import list_schedules
from taskward.store import StateDB

PROBLEM = "application/problem+json"
SURROGATE = "x\ud800"
ECHO = {"action_kind": "command", "args": {"argv": ["echo", "hi"]}}
SCHEDULE = {
    "name": "nightly",
    "action_kind": "command",
    "args": {"argv": ["echo"]},
    "cron": "@daily",
}

Client = Callable[..., httpx.AsyncClient]


def registry(**changes: Any) -> taskward.TaskAdapterRegistry:
    config = taskward.AdapterConfig(
        command_allowlist=frozenset({"echo"}), python_modules=frozenset({"json"}), **changes
    )
    return taskward.build_registry(config)


@pytest.fixture
async def make_client(db: StateDB) -> AsyncIterator[Client]:
    """``make_client(registry=...)``: an httpx client on a fresh app over ``db``."""
    clients: list[httpx.AsyncClient] = []

    def make(adapters: taskward.TaskAdapterRegistry | None = None) -> httpx.AsyncClient:
        app = create_app(db, adapters or registry(), HttpConfig())
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def client(make_client: Client) -> httpx.AsyncClient:
    return make_client()


async def post(client: httpx.AsyncClient, url: str, payload: Any, **kwargs: Any) -> httpx.Response:
    """POST ``payload`` as JSON with ``\\uXXXX`` escapes: a lone surrogate travels as the
    escape ``\\ud800`` (valid JSON, valid UTF-8 on the wire), as a hostile client sends it."""
    body = json.dumps(payload, ensure_ascii=True).encode("ascii")
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    return await client.post(url, content=body, headers=headers, **kwargs)


def assert_problem(response: httpx.Response, field: str) -> dict[str, Any]:
    """A 422 problem document naming ``field``, in valid UTF-8 JSON."""
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    problem: dict[str, Any] = json.loads(response.content.decode("utf-8"))  # strict UTF-8
    assert problem["status"] == 422 and problem["type"] == "urn:taskward:problem:invalid-input"
    assert problem["field"] == field, problem
    assert problem["allowed"]
    return problem


async def stored_tasks(db: StateDB) -> int:
    return sum((await count_by_status(db)).values())


async def queued_task(client: httpx.AsyncClient) -> str:
    created = await client.post("/api/tasks", json=ECHO)
    assert created.status_code == 201
    task_id: str = created.json()["task_id"]
    return task_id


# -- lone surrogates and NUL in every text field -----------------------------------------------


@pytest.mark.parametrize("bad", [SURROGATE, "x\x00y"], ids=["surrogate", "nul"])
@pytest.mark.parametrize(
    ("field", "payload"),
    [
        ("action_kind", lambda bad: {**ECHO, "action_kind": bad}),
        ("execution_target", lambda bad: {**ECHO, "execution_target": bad}),
        ("idempotency_key", lambda bad: {**ECHO, "idempotency_key": bad}),
        ("required_capabilities", lambda bad: {**ECHO, "required_capabilities": [bad]}),
        ("library_ref", lambda bad: {**ECHO, "library_ref": bad}),
        ("library_content_hash", lambda bad: {**ECHO, "library_content_hash": bad}),
        ("args.argv[1]", lambda bad: {**ECHO, "args": {"argv": ["echo", bad]}}),
    ],
)
async def test_a_submission_with_unstorable_text_is_a_422_and_stores_nothing(
    client: httpx.AsyncClient,
    db: StateDB,
    field: str,
    payload: Callable[[str], dict[str, Any]],
    bad: str,
) -> None:
    response = await post(client, "/api/tasks", payload(bad))
    problem = assert_problem(response, field)
    if bad == SURROGATE:
        assert "\\ud800" in problem["value"]  # shown escaped, never raw
    assert await stored_tasks(db) == 0


@pytest.mark.parametrize("bad", [SURROGATE, "x\x00y"], ids=["surrogate", "nul"])
@pytest.mark.parametrize("field", ["idempotency_key", "reason"])
async def test_a_cancel_with_unstorable_text_is_a_422_and_changes_nothing(
    client: httpx.AsyncClient, db: StateDB, field: str, bad: str
) -> None:
    task_id = await queued_task(client)
    body = {"idempotency_key": "cancel-1", "reason": "why", field: bad}
    assert_problem(await post(client, f"/api/tasks/{task_id}/cancel", body), field)
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert await taskward.list_transitions(db, task_id) == []
    assert await taskward.list_task_events(db, task_id) == []


@pytest.mark.parametrize("bad", [SURROGATE, "x\x00y"], ids=["surrogate", "nul"])
@pytest.mark.parametrize(
    "field",
    ["name", "timezone", "cron", "misfire_policy", "overlap_policy", "action_kind"],
)
async def test_a_schedule_with_unstorable_text_is_a_422_and_stores_nothing(
    client: httpx.AsyncClient, db: StateDB, field: str, bad: str
) -> None:
    assert_problem(await post(client, "/api/schedules", {**SCHEDULE, field: bad}), field)
    assert await list_schedules(db, include_removed=True) == []
    assert await stored_tasks(db) == 0


async def test_a_manual_fire_with_an_unstorable_key_is_a_422(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    created = await post(client, "/api/schedules", SCHEDULE)
    assert created.status_code == 201, created.text
    schedule_id = created.json()["id"]
    for key in (SURROGATE, "manual:\n"):
        fired = await post(client, f"/api/schedules/{schedule_id}/fire", {"idempotency_key": key})
        assert_problem(fired, "idempotency_key")
    assert await stored_tasks(db) == 0


async def test_an_unknown_kind_with_a_surrogate_lists_the_kinds_it_could_have_been(
    client: httpx.AsyncClient,
) -> None:
    """Even the error that echoes the kind back (AdapterNotRegistered) renders."""
    problem = assert_problem(
        await post(client, "/api/tasks", {**ECHO, "action_kind": "\udcff"}), "action_kind"
    )
    assert problem["value"] == "\\udcff"


# -- bounds: keys, capabilities, function names, timeouts ---------------------------------------


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("idempotency_key", {"idempotency_key": "a\tb"}),
        ("idempotency_key", {"idempotency_key": "line\nforged"}),
        ("idempotency_key", {"idempotency_key": "bell\x07"}),
        ("idempotency_key", {"idempotency_key": "k" * 256}),
        ("required_capabilities", {"required_capabilities": [f"c{i}" for i in range(33)]}),
        ("required_capabilities", {"required_capabilities": ["g" * (MAX_CAPABILITY_LENGTH + 1)]}),
        ("required_capabilities", {"required_capabilities": ["x" * 100_000]}),
        ("required_capabilities", {"required_capabilities": ["gpu\n"]}),
        ("args.function", {"action_kind": "python", "args": {"function": "json:dumps\n"}}),
        ("args.timeout_s", {"args": {"argv": ["echo"], "timeout_s": 1e308}}),
        ("args.timeout_s", {"args": {"argv": ["echo"], "timeout_s": 1e12}}),
        (
            "args.timeout_s",
            {"action_kind": "python", "args": {"function": "json:dumps", "timeout_s": 1e12}},
        ),
        ("args.timeout_s", {"action_kind": "agent", "args": {"timeout_s": 604801}}),
        ("args.timeout_s", {"action_kind": "agent", "args": {"timeout_s": "60"}}),
        ("args.timeout_s", {"action_kind": "agent", "args": {"timeout_s": True}}),
        ("args.timeout_s", {"action_kind": "agent", "args": {"timeout_s": 0}}),
        ("args.timeout_s", {"action_kind": "agent", "args": {"timeout_s": -5}}),
        ("args.timeout_s", {"action_kind": "agent", "args": {"timeout_s": 10**400}}),
    ],
)
async def test_unbounded_or_unprintable_input_is_a_422_and_stores_nothing(
    client: httpx.AsyncClient, db: StateDB, field: str, change: dict[str, Any]
) -> None:
    problem = assert_problem(await post(client, "/api/tasks", {**ECHO, **change}), field)
    assert len(json.dumps(problem)) < 10_000  # the echo is bounded
    if field == "args.timeout_s":
        assert "604800" in problem["allowed"]  # the range is named
    if field == "required_capabilities" and len(change["required_capabilities"]) > 1:
        assert str(MAX_CAPABILITIES) in problem["allowed"]
    assert await stored_tasks(db) == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
async def test_a_non_finite_number_in_args_is_a_422_that_renders(
    client: httpx.AsyncClient, db: StateDB, literal: str
) -> None:
    """Python's JSON parser accepts ``NaN``; the problem document must still render."""
    body = '{"action_kind": "agent", "args": {"timeout_s": ' + literal + "}}"
    response = await client.post(
        "/api/tasks", content=body, headers={"Content-Type": "application/json"}
    )
    assert_problem(response, "args")
    assert await stored_tasks(db) == 0


async def test_the_largest_timeout_and_a_printable_key_with_spaces_are_admitted(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    ok = await post(
        client,
        "/api/tasks",
        {
            "action_kind": "agent",
            "args": {"timeout_s": 604800},
            "idempotency_key": "nightly report 2026-12-02 \u00e9t\u00e9",
            "required_capabilities": [f"c{i}" for i in range(MAX_CAPABILITIES)],
        },
    )
    assert ok.status_code == 201, ok.text
    assert await stored_tasks(db) == 1


async def test_the_deployments_maximum_timeout_is_the_limit(
    make_client: Client, db: StateDB
) -> None:
    client = make_client(registry(max_task_timeout_s=60))
    over = await post(client, "/api/tasks", {"action_kind": "agent", "args": {"timeout_s": 61}})
    assert "60" in assert_problem(over, "args.timeout_s")["allowed"]
    at = await post(client, "/api/tasks", {"action_kind": "agent", "args": {"timeout_s": 60}})
    assert at.status_code == 201
    assert await stored_tasks(db) == 1


async def test_a_cancel_key_with_control_characters_is_a_422(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = await queued_task(client)
    for key in ("a\nb", "k" * 256):
        assert_problem(
            await post(client, f"/api/tasks/{task_id}/cancel", {"idempotency_key": key}),
            "idempotency_key",
        )
    assert (await taskward.get_task(db, task_id))["status"] == "queued"


# -- the dashboard and the CLI ----------------------------------------------------------------


async def test_the_dashboards_cancel_form_with_a_nul_in_its_reason_is_a_clean_422(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    """A form cannot carry a lone surrogate (invalid UTF-8 in a form decodes to U+FFFD), but
    it can carry a NUL (``%00``), which PostgreSQL cannot store, and a control character."""
    task_id = await queued_task(client)
    page = await client.get(f"/tasks/{task_id}")
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert csrf
    for form in ({"reason": "stop\x00now"}, {"idempotency_key": "k\nforged"}):
        response = await client.post(
            f"/tasks/{task_id}/cancel", data={"csrf_token": csrf.group(1), **form}
        )
        assert response.status_code == 422, response.text
        assert "Traceback" not in response.text
        assert (await taskward.get_task(db, task_id))["status"] == "queued"


def run_cli(db_url: str, tmp_path: Path, *args: str | bytes) -> subprocess.CompletedProcess[str]:
    """The CLI as a shell runs it: argv bytes that are not UTF-8 arrive as surrogateescape."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    return subprocess.run(
        [sys.executable, "-m", "taskward.cli.main", "--db", db_url, *args],
        capture_output=True,
        text=True,
        errors="replace",
        cwd=tmp_path,
        env={**env, "LC_ALL": "C.UTF-8"},
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv",
    [
        [b"task", b"submit", b"agent\xff"],
        [b"task", b"submit", b"agent", b"--key", b"k\xff"],
        [b"task", b"submit", b"agent", b"--key", b"k\x07"],
        [b"task", b"submit", b"agent", b"--args", b'{"objective": "\xff"}'],
        [b"task", b"submit", b"agent", b"--capability", b"gpu\xff"],
    ],
)
async def test_the_cli_refuses_undecodable_arguments_with_exit_2(
    db: StateDB, db_url: str, tmp_path: Path, argv: list[bytes]
) -> None:
    done = run_cli(db_url, tmp_path, *argv)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("taskward: error:"), done.stderr
    assert await stored_tasks(db) == 0


async def test_the_cli_refuses_an_undecodable_cancel_reason_and_key_with_exit_2(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    submitted = run_cli(db_url, tmp_path, "task", "submit", "agent", "--key", "k1")
    assert submitted.returncode == 0, submitted.stderr
    task_id = submitted.stdout.strip().splitlines()[-1]
    for extra in ([b"--reason", b"why\xff"], [b"--key", b"c\xff"], [b"--key", b"c\tx"]):
        done = run_cli(db_url, tmp_path, "task", "cancel", task_id, *extra)
        assert done.returncode == EXIT_BAD_INPUT, done.stderr
        assert "Traceback" not in done.stderr
        assert done.stderr.splitlines()[-1].startswith("taskward: error:"), done.stderr
    assert (await taskward.get_task(db, task_id))["status"] == "queued"
    assert await taskward.list_transitions(db, task_id) == []
