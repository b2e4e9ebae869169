"""The dashboard's overview, task list, task page and schedules (issue 28) over ASGI on SQLite
and PostgreSQL: charts drawn from the facts, only the targets and kinds in use, search and
filters in the URL with both page links and a total, bulk cancel and retry of a selection
(CSRF-protected, a flash after), one output block, no lease once ended, schedules spelled out.
"""

from __future__ import annotations

import html as html_lib
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

import taskward
from taskward import StateReason
from taskward.dashboard import views
from taskward.http import HttpConfig, create_app
from taskward.reads import count_by_status
from taskward.schedules import create_schedule, disable_schedule
from taskward.store import StateDB
from tests.integration.helpers import REGISTRY, move, request, submit

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
BULK_KEY = re.compile(
    r'<form method="post" action="/tasks/bulk" id="bulk-form".*?'
    r'name="idempotency_key" value="([^"]+)"',
    re.S,
)


@pytest.fixture
async def client(db: StateDB) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(db, REGISTRY, HttpConfig())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as c:
        yield c


def text_of(page: str, selector_re: str) -> str:
    found = re.search(selector_re, page, re.S)
    assert found, selector_re
    return html_lib.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip()


async def fail_with_output(db: StateDB, lines: int = 40) -> str:
    """A task that ran and failed, as the command adapter records it: the output's tail in the
    evidence and in the error after its first line."""
    task_id = await submit(db, args={"argv": ["echo", "forty-lines"]})
    await move(db, task_id, "queued", "running")
    output = "".join(f"output line {i}\n" for i in range(1, lines + 1))
    now = await db.now()
    evidence = [
        {
            "kind": "process",
            "argv0": "sh",
            "pid": 4242,
            "exit_code": 3,
            "started_at": now - 2.5,
            "ended_at": now,
            "duration_s": 2.5,
            "output_bytes": len(output),
            "output_truncated": False,
            "output_tail": output,
        }
    ]
    fail = request(task_id, "running", "failed", code="execution_failed")
    fail = fail.model_copy(
        update={
            "reason": StateReason(
                code="execution_failed", summary="exit code 3", evidence_refs=evidence
            )
        }
    )
    patch = {"exit_code": 3, "error_detail": "exit code 3\n" + output, "ended_at": now}
    result = await taskward.transition_task(db, fail, patch=patch)
    assert result.applied
    return task_id


async def test_the_overview_charts_the_facts_and_shows_only_what_is_in_use(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    for _ in range(2):
        task_id = await submit(db)
        await move(db, task_id, "queued", "running", "completed")
    await fail_with_output(db)
    await submit(db)  # one still queued
    page = (await client.get("/")).text
    bars = re.findall(r'<rect class="bar (c-[\w-]+)"[^>]*data-value="([\d.]+)"', page)
    assert ("c-completed", "2") in bars and ("c-failed", "1") in bars
    assert 'data-chart="chart-depth"' in page and 'data-chart="chart-p95-1"' in page
    assert re.search(r'<h3><a href="/tasks\?kind=command">command</a></h3>', page)
    counts = text_of(page, r'data-region="counts">(.*?)</table>')
    assert "host" in counts and "daytona" not in counts and "running" not in counts
    kinds = re.search(r'data-region="kinds">(.*?)</table>', page, re.S)
    assert kinds and '<a href="/tasks?kind=command">command</a>' in kinds.group(1)
    assert '<td class="num bad"><a href="/tasks?kind=command&amp;status=failed">1</a>' in (
        kinds.group(1)
    )
    for name in ("6h", "24h", "7d"):
        assert (await client.get(f"/?range={name}")).status_code == 200
    bad = await client.get("/?range=1y")
    assert bad.status_code == 422 and "range" in bad.text
    polled = (await client.get("/ui/data/overview")).json()["regions"]
    assert "charts" not in polled and "counts" in polled  # the charts are drawn, not polled


async def test_search_filters_and_both_page_links_live_in_the_url(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    now = await db.now()
    made = [await submit(db, now=now - 200 + i) for i in range(views.PAGE_SIZE + 5)]
    needle = await submit(db, args={"argv": ["echo", "Invoice-ZQ4711"]})
    page = await client.get("/tasks?q=invoice-zq47")
    listed = (await client.get("/ui/data/tasks?q=invoice-zq47")).json()["regions"]
    assert [
        c["title"]
        for r in listed["tasks"]["rows"]
        for c in r
        if c.get("href", "").startswith("/tasks/")
    ] == [needle]
    assert listed["count"]["text"] == "1 task match"
    assert 'value="invoice-zq47"' in page.text
    assert "data-poll=" not in page.text  # a search is read once, not rescanned every poll
    assert (
        'data-poll="/ui/data/tasks?status=failed"'
        in (await client.get("/tasks?status=failed")).text
    )
    first = (await client.get("/ui/data/tasks")).json()["regions"]
    assert first["count"]["text"] == f"{len(made) + 1} tasks \u00b7 {views.PAGE_SIZE} shown"
    assert first["newer"]["href"] is None
    older = first["next"]["href"]
    assert older.startswith("/tasks?cursor=")
    second = (await client.get("/ui/data" + older)).json()["regions"]
    assert len(second["tasks"]["rows"]) == 6
    back = second["newer"]["href"]
    assert back.startswith("/tasks?newer=")
    again = (await client.get("/ui/data" + back)).json()["regions"]
    assert again["tasks"]["rows"] == first["tasks"]["rows"][: len(again["tasks"]["rows"])]
    filtered = (await client.get("/ui/data/tasks?status=queued&kind=command&q=zq4711")).json()
    assert filtered["regions"]["count"]["text"] == "1 task match"
    assert (await client.get("/tasks?q=" + "x" * 300)).status_code == 422


async def test_a_row_shows_relative_time_duration_preview_and_why(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    failed = await fail_with_output(db)
    listed = (await client.get("/ui/data/tasks")).json()["regions"]["tasks"]
    assert listed["columns"][0] == ""  # the selection box
    row = {col: c for col, c in zip(listed["columns"], listed["rows"][0], strict=True)}
    assert row[""]["check"] == failed
    assert row["task"]["title"] == failed and row["task"]["text"] == failed.rsplit("-", 1)[1]
    assert row["created"]["text"] == "just now" and row["created"]["title"].endswith(" UTC")
    assert row["ran"]["text"].endswith(" s")
    assert row["arguments"]["text"] == '{"argv":["echo","forty-lines"]}'
    assert row["why"]["text"] == "execution_failed: exit code 3"


async def post_form(client: httpx.AsyncClient, body: list[tuple[str, str]]) -> httpx.Response:
    """A form post with repeated fields (the list's selection boxes)."""
    return await client.post(
        "/tasks/bulk",
        content=urlencode(body),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )


async def bulk_form(client: httpx.AsyncClient, query: str = "") -> dict[str, str]:
    page = (await client.get("/tasks" + query)).text
    csrf, key = CSRF_META.search(page), BULK_KEY.search(page)
    assert csrf and key, page
    return {"csrf_token": csrf.group(1), "idempotency_key": key.group(1), "next": "/tasks" + query}


async def test_bulk_retry_and_cancel_of_a_selection_with_a_flash(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    failed = [await fail_with_output(db, 3) for _ in range(2)]
    queued = [await submit(db) for _ in range(2)]
    form = await bulk_form(client, "?status=failed")
    ids = [("task_id", t) for t in failed] + [("task_id", queued[0])]
    body = [*form.items(), ("action", "retry"), *ids]
    r = await post_form(client, body)
    assert r.status_code == 303
    assert r.headers["location"] == "/tasks?status=failed&done=retried&n=2&of=3"
    shown = (await client.get(r.headers["location"])).text
    assert "retried 2 of 3 selected tasks" in shown
    total = sum((await count_by_status(db)).values())
    assert total == 6
    again = await post_form(client, body)
    assert again.status_code == 303  # the same key: nothing new
    assert sum((await count_by_status(db)).values()) == 6

    cancel = [*form.items(), ("action", "cancel"), *(("task_id", t) for t in queued)]
    r = await post_form(client, cancel)
    assert "done=cancelled&n=2&of=2" in r.headers["location"]
    for t in queued:
        assert (await taskward.get_task(db, t))["status"] == "cancelled"

    no_token = [(k, v) for k, v in cancel if k != "csrf_token"]
    assert (await post_form(client, no_token)).status_code == 403
    unknown = [*form.items(), ("action", "delete"), ("task_id", failed[0])]
    assert (await post_form(client, unknown)).status_code == 422
    crafted = (await client.get("/tasks?done=retried&n=<b>x</b>&of=1")).text
    assert 'id="flash"' not in crafted


async def test_a_failed_task_shows_its_output_once_and_no_lease(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = await fail_with_output(db)
    page = (await client.get(f"/tasks/{task_id}")).text
    assert page.count("output line 40") == 1
    output = text_of(page, r'data-region="output"><pre tabindex="0">(.*?)</pre>')
    assert output.splitlines() == [f"output line {i}" for i in range(1, 41)]
    for gone in ("leased_by", "lease_expires", "deadline"):
        assert f'data-field="{gone}"' not in page
    assert text_of(page, r'data-field="error"[^>]*>(.*?)</dd>') == "exit code 3"
    evidence = text_of(page, r'data-region="evidence">(.*?)</dl>')
    assert "2.50 s" in evidence and "output_tail" not in evidence and "4242" in evidence
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT[\d:]+\+00:00" data-at="[\d.]+">', page)
    assert '<link rel="icon" href="/static/favicon.svg"' in page
    assert (await client.get("/static/favicon.svg")).status_code == 200


async def test_a_running_task_shows_its_lease_and_a_cancel_says_what_it_did(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    task_id = await submit(db)
    await move(db, task_id, "queued", "running")
    page = (await client.get(f"/tasks/{task_id}")).text
    assert 'data-field="started"' in page and 'data-confirm="Cancel this task?' in page
    flash = (await client.get(f"/tasks/{task_id}?cancel=cancellation_requested")).text
    assert "cancellation requested: the worker running it stops it" in flash
    assert 'id="flash"' not in (await client.get(f"/tasks/{task_id}?cancel=<i>")).text


async def test_schedules_spell_out_skips_zones_and_no_next_fire_when_disabled(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    now = time.time()
    berlin = await create_schedule(
        db,
        name="berlin",
        action_kind="command",
        args={"argv": ["true"]},
        cron="0 18 * * *",
        timezone="Europe/Berlin",
        registry=REGISTRY,
        now=now,
    )
    off = await create_schedule(
        db,
        name="off",
        action_kind="command",
        args={"argv": ["true"]},
        interval_s=60,
        registry=REGISTRY,
        now=now,
    )
    await disable_schedule(db, off["id"])
    regions: dict[str, Any] = (await client.get("/ui/data/schedules")).json()["regions"]
    table = regions["schedules"]
    assert "skipped: previous still running" in table["columns"]
    assert "skipped: fire time missed" in table["columns"]
    rows = {r[0]["text"]: dict(zip(table["columns"], r, strict=True)) for r in table["rows"]}
    assert rows["off"]["next fire"]["text"] == "none (disabled)"
    shown = rows["berlin"]["next fire"]["text"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 18:00:00 CES?T \u00b7 1[67]:00:00 UTC", shown), shown
    assert rows["berlin"]["cadence"]["text"] == "cron 0 18 * * * in Europe/Berlin"
    assert berlin["timezone"] == "Europe/Berlin"
