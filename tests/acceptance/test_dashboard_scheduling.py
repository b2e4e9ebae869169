"""The scheduling vocabulary on the dashboard (DESIGN.md R15-R20), over ASGI on SQLite and
PostgreSQL: a task's page and the lists show when a delayed task runs, its priority, its attempt
ceiling and its limit key; "held by limit" links to the limits page; ``/limits`` shows every
limit with what counts against it and sets, clears, pauses and resumes with CSRF-protected forms
that need the ``operate`` scope. Bad input names the field and stores nothing.
"""

from __future__ import annotations

import html as html_lib
import re
import time
from typing import Any

import httpx

from taskward.claims import WorkerSpec, claim_runs
from taskward.dashboard import views
from taskward.limits import list_limits, set_limit
from taskward.store import StateDB
from tests.acceptance.test_dashboard_retry import (
    CSRF_META,
)
from tests.acceptance.test_dashboard_retry import client as client
from tests.acceptance.test_dashboard_retry import make_client as make_client
from tests.integration.helpers import REGISTRY, move, submit

LIMIT_FORM = re.compile(r'<form method="post" action="/limits/set" id="limit-form"')


def field_text(page: str, key: str) -> str | None:
    """The text of the task page's field ``key`` (markup removed), or None when it is not shown."""
    found = re.search(rf'<dd data-field="{key}"[^>]*>(.*?)</dd>', page, re.S)
    return html_lib.unescape(re.sub(r"<[^>]+>", "", found.group(1))) if found else None


def field_href(page: str, key: str) -> str | None:
    found = re.search(rf'<dd data-field="{key}"[^>]*><a href="([^"]+)">', page)
    return html_lib.unescape(found.group(1)) if found else None


def twin_field(regions: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((i for i in regions["fields"]["items"] if i["key"] == key), None)


def list_row(regions: dict[str, Any], task_id: str) -> dict[str, str]:
    """A task's row of a list region, by column name."""
    table = regions["tasks"] if "tasks" in regions else regions["recent"]
    for line in table["rows"]:
        if line[0]["text"] == task_id:
            return {col: c["text"] for col, c in zip(table["columns"], line, strict=True)}
    raise AssertionError(f"{task_id} not listed")


async def csrf_of(client: httpx.AsyncClient, path: str = "/limits") -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    found = CSRF_META.search(page.text)
    assert found
    return found.group(1)


async def limits_now(db: StateDB) -> list[tuple[Any, ...]]:
    return [
        (x["limit_key"], x["max_running"], x["rate"], x["period_s"]) for x in await list_limits(db)
    ]


# -- a task's page and the lists ----------------------------------------------------------


async def test_a_delayed_task_shows_when_it_runs_on_its_page_and_in_the_lists(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    run_after = time.time() + 3 * 3600
    delayed = await submit(db, run_after=run_after)
    due = await submit(db, run_after=time.time() - 60)  # in the past: starts at once
    plain = await submit(db)

    page = (await client.get(f"/tasks/{delayed}")).text
    assert field_text(page, "status") == "queued"
    assert field_text(page, "runs_at") == f"{views.fmt_time(run_after)} (in 3.0 h)"
    assert "delayed: runs at" in (field_text(page, "placement") or "")
    twin = (await client.get(f"/ui/data/tasks/{delayed}")).json()["regions"]
    assert twin_field(twin, "runs_at") == {
        "key": "runs_at",
        "label": "runs at",
        "text": f"{views.fmt_time(run_after)} (in 3.0 h)",
    }
    for task_id in (due, plain):
        other = (await client.get(f"/tasks/{task_id}")).text
        assert field_text(other, "runs_at") is None
        assert (
            twin_field((await client.get(f"/ui/data/tasks/{task_id}")).json()["regions"], "runs_at")
            is None
        )

    listed = (await client.get("/ui/data/tasks")).json()["regions"]
    assert list_row(listed, delayed)["status"] == "queued \u00b7 runs in 3.0 h"
    assert list_row(listed, due)["status"] == "queued"
    assert list_row(listed, plain)["status"] == "queued"
    assert "queued \u00b7 runs in 3.0 h" in (await client.get("/tasks")).text
    overview = (await client.get("/ui/data/overview")).json()["regions"]
    assert list_row(overview, delayed)["status"] == "queued \u00b7 runs in 3.0 h"
    # Once it is no longer queued, it no longer "runs at".
    await move(db, delayed, "queued", "cancelled")
    assert field_text((await client.get(f"/tasks/{delayed}")).text, "runs_at") is None
    listed = (await client.get("/ui/data/tasks")).json()["regions"]
    assert list_row(listed, delayed)["status"] == "cancelled"


async def test_priority_shows_when_it_is_not_zero(client: httpx.AsyncClient, db: StateDB) -> None:
    high = await submit(db, priority=50)
    low = await submit(db, priority=-10)
    plain = await submit(db)
    assert field_text((await client.get(f"/tasks/{high}")).text, "priority") == "+50"
    assert field_text((await client.get(f"/tasks/{low}")).text, "priority") == "-10"
    assert field_text((await client.get(f"/tasks/{plain}")).text, "priority") is None
    listed = (await client.get("/ui/data/tasks")).json()["regions"]
    assert "priority" in listed["tasks"]["columns"]
    assert [list_row(listed, t)["priority"] for t in (high, low, plain)] == ["+50", "-10", "-"]


async def test_attempts_show_as_attempt_n_of_the_rows_own_ceiling(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = await submit(db, max_attempts=5)
    default = await submit(db)
    assert field_text((await client.get(f"/tasks/{task_id}")).text, "attempts") == (
        "no attempt yet (at most 5)"
    )
    assert field_text((await client.get(f"/tasks/{default}")).text, "attempts") == (
        "no attempt yet (at most 3)"
    )
    await claim_runs(db, WorkerSpec(worker_id="host:dash0001", kinds=REGISTRY.kinds()), limit=2)
    assert field_text((await client.get(f"/tasks/{task_id}")).text, "attempts") == (
        "attempt 1 of 5"
    )
    listed = (await client.get("/ui/data/tasks")).json()["regions"]
    assert list_row(listed, task_id)["attempts"] == "1/5"
    assert list_row(listed, default)["attempts"] == "1/3"


async def test_the_limit_key_and_held_by_limit_link_to_the_limits_page(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    await set_limit(db, "tenant:acme", max_running=0)
    held = await submit(db, limit_key="tenant:acme")
    free = await submit(db)
    page = (await client.get(f"/tasks/{held}")).text
    assert field_text(page, "limit_key") == "tenant:acme"
    assert field_href(page, "limit_key") == "/limits?key=tenant%3Aacme"
    assert field_text(page, "placement") == (
        "held by limit tenant:acme \u2014 paused (max_running 0)"
    )
    assert field_href(page, "placement") == "/limits?key=tenant%3Aacme"
    twin = (await client.get(f"/ui/data/tasks/{held}")).json()["regions"]
    assert twin_field(twin, "placement") == {
        "key": "placement",
        "label": "placement",
        "text": "held by limit tenant:acme \u2014 paused (max_running 0)",
        "href": "/limits?key=tenant%3Aacme",
    }
    other = (await client.get(f"/tasks/{free}")).text
    assert field_text(other, "limit_key") is None
    assert field_href(other, "placement") is None  # not held: no link
    # Full rather than paused: the count reads after the dash.
    await set_limit(db, "kind:command", max_running=1)
    await claim_runs(db, WorkerSpec(worker_id="host:dash0002", kinds=REGISTRY.kinds()), limit=1)
    page = (await client.get(f"/tasks/{held}")).text
    assert field_text(page, "placement") == (
        "held by limit kind:command \u2014 1 running of at most 1"
    )
    assert field_href(page, "placement") == "/limits?key=kind%3Acommand"
