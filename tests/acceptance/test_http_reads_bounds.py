"""What the read bindings show, and how much: bounded cursors, bounded listings, redacted env.

- A cursor is client input: a crafted one (deeply nested JSON, another shape, over the length
  bound) is a 422 in the API, a 422 page or problem in the dashboard and a TaskValidationError
  in the library, never a RecursionError 500.
- A listing (library, API, dashboard, CLI) carries ``args_preview`` and ``args_bytes``, never
  the args: its size does not grow with them; the task's own endpoint has them whole.
- ``args.env`` values are secrets: no read binding shows them (API, dashboard, CLI), while the
  command child still gets them.

Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import taskward
from taskward.cursors import MAX_CURSOR_LENGTH, decode_cursor, encode_cursor
from taskward.errors import TaskValidationError
from taskward.http import HttpConfig, create_app
from taskward.outbox import list_notifications
from taskward.reads import ARGS_PREVIEW_CHARS, REDACTED
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store import StateDB

SECRET = "s3cret"
ALLOWLIST = frozenset({"echo", "sh"})


def registry() -> taskward.TaskAdapterRegistry:
    return taskward.build_registry(taskward.AdapterConfig(command_allowlist=ALLOWLIST))


@pytest.fixture
async def client(db: StateDB) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(db, registry(), HttpConfig())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        yield http


async def submit(db: StateDB, key: str, args: dict[str, Any]) -> str:
    app = taskward.TaskApplication(
        action_kind="command", args=args, execution_target="host", idempotency_key=key
    )
    return await taskward.submit_task(db, app, registry=registry())


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# -- cursors --------------------------------------------------------------------------------

# Nested deeper than the interpreter's recursion limit, and still within the length bound of
# the API (base64 of 740 bytes is 987 characters): the bound alone does not protect a parser
# running on a deeper stack, so the decoder must refuse the shape.
DEEP = b64(b"[" * 5000)
DEEP_IN_BOUND = b64(b"[" * 740)
BAD_CURSORS = [
    DEEP,
    DEEP_IN_BOUND,
    b64(b'{"created_at": 1, "id": "x"}'),
    b64(b"[1, 2]"),
    b64(b'["1", "x"]'),
    b64(b'[1, "x", 3]'),
    b64(b'[NaN, "x"]'),
    b64(b'[1e999, "x"]'),
    b64(b'[1, "x\\u0000"]'),
    b64(b"not json"),
    "garbage!",
    "A" * (MAX_CURSOR_LENGTH + 1),
]


def test_the_decoder_reads_what_it_writes_and_refuses_any_other_shape() -> None:
    for created_at, task_id in [(1.5, "abc"), (1_796_000_000.123456, '01a2-\u00e9"\\'), (0, "")]:
        cursor = encode_cursor({"created_at": created_at, "id": task_id})
        assert decode_cursor(cursor) == (created_at, task_id)
    for bad in [*BAD_CURSORS, b64(b"[" * 200_000), ""]:
        with pytest.raises(TaskValidationError) as caught:
            decode_cursor(bad)
        assert caught.value.field == "cursor"


async def test_library_listings_refuse_a_deeply_nested_cursor(db: StateDB) -> None:
    huge = b64(b"[" * 100_000)  # no length bound in front of the library: the decoder's own
    with pytest.raises(TaskValidationError):
        await taskward.list_tasks(db, cursor=huge)
    with pytest.raises(TaskValidationError):
        await list_notifications(db, cursor=huge)


async def test_the_api_answers_a_bad_cursor_with_a_422(client: httpx.AsyncClient) -> None:
    for bad in BAD_CURSORS:
        r = await client.get("/api/tasks", params={"cursor": bad})
        assert r.status_code == 422, (bad[:40], r.text[:300])
        assert r.headers["content-type"] == "application/problem+json"


async def test_the_dashboard_answers_a_bad_cursor_with_a_422_never_a_500(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    await submit(db, "one", {"argv": ["echo", "hi"]})
    for bad in BAD_CURSORS:
        for path in ("/tasks", "/outbox"):
            page = await client.get(path, params={"cursor": bad})
            assert page.status_code == 422, (path, bad[:40], page.text[:300])
            assert "text/html" in page.headers["content-type"]
            assert "cursor" in page.text
        for path in ("/ui/data/tasks", "/ui/data/outbox"):
            data = await client.get(path, params={"cursor": bad})
            assert data.status_code == 422, (path, bad[:40], data.text[:300])
            assert data.json()["field"] == "cursor"


async def test_a_real_cursor_still_pages_the_api_and_the_dashboard(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    ids = [await submit(db, f"p{i}", {"argv": ["echo", str(i)]}) for i in range(3)]
    first = (await client.get("/api/tasks", params={"limit": 2})).json()
    rest = (await client.get("/api/tasks", params={"cursor": first["next_cursor"]})).json()
    assert [t["id"] for t in first["tasks"] + rest["tasks"]] == ids[::-1]
    page = await client.get("/tasks", params={"cursor": first["next_cursor"]})
    assert page.status_code == 200 and ids[0] in page.text and ids[2] not in page.text


# -- listings are bounded -------------------------------------------------------------------

BIG = 256 * 1024
N_BIG = 12
# A listed row is its columns and a preview: a few hundred bytes, whatever the args.
ROW_BOUND = 2048


async def test_a_listing_does_not_grow_with_the_args_and_the_task_has_them_whole(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    ids = [
        await submit(db, f"big-{i}", {"argv": ["echo", f"{i}" + "x" * BIG]}) for i in range(N_BIG)
    ]
    small = await submit(db, "small", {"argv": ["echo", "hi"]})

    r = await client.get("/api/tasks", params={"limit": 500})
    assert r.status_code == 200
    assert len(r.content) < (N_BIG + 1) * ROW_BOUND, len(r.content)
    listed = {t["id"]: t for t in r.json()["tasks"]}
    for task_id in ids:
        row = listed[task_id]
        assert "action_args" not in row
        assert row["args_bytes"] > BIG
        assert row["args_preview"].startswith('{"argv":')
        assert row["args_preview"].endswith("\u2026")
        assert len(row["args_preview"]) == ARGS_PREVIEW_CHARS + 1
    assert listed[small]["args_preview"] == '{"argv":["echo","hi"]}'
    assert listed[small]["args_bytes"] >= len('{"argv":["echo","hi"]}')

    whole = (await client.get(f"/api/tasks/{ids[3]}")).json()
    assert whole["action_args"] == {"argv": ["echo", "3" + "x" * BIG]}

    # the library's listing is bounded the same way (the store never sent the args) ...
    rows, _ = await taskward.list_tasks(db, limit=500)
    assert len(json.dumps(rows)) < (N_BIG + 1) * ROW_BOUND
    # ... unless a library caller asks for them whole
    full, _ = await taskward.list_tasks(db, limit=500, full_args=True)
    by_id = {row["id"]: row for row in full}
    assert by_id[ids[0]]["action_args"] == {"argv": ["echo", "0" + "x" * BIG]}

    # the dashboard's list and its data endpoint
    for path in ("/tasks", "/ui/data/tasks", "/", "/ui/data/overview"):
        page = await client.get(path)
        assert page.status_code == 200, path
        assert "x" * 1000 not in page.text, path
    assert "/api/tasks/{task_id}" in json.dumps((await client.get("/openapi.json")).json())


async def test_a_listed_row_has_every_column_of_the_task_but_its_args(db: StateDB) -> None:
    """run_list names its columns (to leave action_args out): a new column must be added."""
    task_id = await submit(db, "cols", {"argv": ["echo", "hi"]})
    (listed,), _ = await taskward.list_tasks(db)
    row = await taskward.get_task(db, task_id)
    assert set(listed) == set(row) - {"action_args"} | {"args_preview", "args_bytes"}
    assert {k: listed[k] for k in row if k != "action_args"} == {
        k: v for k, v in row.items() if k != "action_args"
    }


# -- args.env is redacted in every read binding ---------------------------------------------


async def run_worker(db: StateDB) -> None:
    """What ``taskward worker --burst`` runs: claim, execute, record, exit once idle."""
    config = WorkerConfig(
        concurrency=2,
        idle_wait_s=0.02,
        cancel_poll_s=0.05,
        reap_interval_s=30.0,
        exit_when_idle=True,
        run_scheduler=False,
        deliver_outbox=False,
    )
    assert await asyncio.wait_for(WorkerRuntime(db, registry(), config).run(), 60) == 0


async def secret_tasks(db: StateDB, tmp_path: Path) -> tuple[str, str, Path]:
    """A command that writes what it got as API_KEY to a file (not to its output, which is
    evidence every reader sees), run by a worker; and a queued one whose args are over the
    inline bound (its preview comes from the store's text, where on PostgreSQL ``env`` sorts
    first)."""
    seen = tmp_path / "seen"
    ran = await submit(
        db,
        "env-ran",
        {"argv": ["sh", "-c", 'printenv API_KEY > "$0"', str(seen)], "env": {"API_KEY": SECRET}},
    )
    await run_worker(db)
    big = await submit(
        db, "env-big", {"argv": ["echo", "y" * 5000], "env": {"API_KEY": SECRET, "B": SECRET}}
    )
    return ran, big, seen


async def test_env_values_never_appear_in_the_api_or_the_dashboard(
    client: httpx.AsyncClient, db: StateDB, tmp_path: Path
) -> None:
    ran, big, seen = await secret_tasks(db, tmp_path)
    assert seen.read_text() == SECRET + "\n"  # the child got the real value
    assert (await taskward.get_task(db, ran))["status"] == "completed"

    task = await client.get(f"/api/tasks/{ran}")
    assert task.status_code == 200
    assert task.json()["action_args"]["env"] == {"API_KEY": REDACTED}
    listing = await client.get("/api/tasks")
    previews = {t["id"]: t["args_preview"] for t in listing.json()["tasks"]}
    assert f'"env":{{"API_KEY":"{REDACTED}"}}' in previews[ran]
    assert (await client.get(f"/api/tasks/{big}")).json()["action_args"]["env"] == {
        "API_KEY": REDACTED,
        "B": REDACTED,
    }
    bodies = {"task": task.text, "list": listing.text}
    bodies["big"] = (await client.get(f"/api/tasks/{big}")).text
    for path in (
        f"/tasks/{ran}",
        f"/ui/data/tasks/{ran}",
        f"/tasks/{big}",
        f"/ui/data/tasks/{big}",
        "/tasks",
        "/ui/data/tasks",
        "/",
        "/ui/data/overview",
    ):
        page = await client.get(path)
        assert page.status_code == 200, path
        bodies[path] = page.text
    assert "API_KEY" in bodies[f"/ui/data/tasks/{ran}"]  # the name is kept
    for where, text in bodies.items():
        assert SECRET not in text, where

    # the library's own reads redact too; the raw value is there only when asked for
    for row in (await taskward.list_tasks(db, full_args=True))[0]:
        assert SECRET not in json.dumps(row)
    revealed = await taskward.get_task(db, ran, reveal_env=True)
    assert revealed["action_args"]["env"] == {"API_KEY": SECRET}


def cli(db_url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    return subprocess.run(
        [sys.executable, "-m", "taskward.cli.main", "--db", db_url, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


async def test_env_values_never_appear_in_the_cli(db: StateDB, db_url: str, tmp_path: Path) -> None:
    ran, big, seen = await secret_tasks(db, tmp_path)
    assert seen.read_text() == SECRET + "\n"
    outputs = {}
    for args in (
        ("task", "show", ran),
        ("task", "show", ran, "--json"),
        ("task", "show", big, "--json"),
        ("task", "list"),
        ("task", "list", "--json"),
        ("task", "wait", ran, "--json"),
    ):
        done = await asyncio.to_thread(cli, db_url, tmp_path, *args)
        assert done.returncode == 0, (args, done.stderr)
        outputs[args] = done.stdout + done.stderr
    shown = json.loads(outputs[("task", "show", ran, "--json")])
    assert shown["action_args"]["env"] == {"API_KEY": REDACTED}
    assert "API_KEY" in outputs[("task", "show", ran)]
    listed = json.loads(outputs[("task", "list", "--json")])["tasks"]
    assert all("action_args" not in t and "args_preview" in t for t in listed)
    for args, text in outputs.items():
        assert SECRET not in text, args
