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
import pytest

from taskward.claims import WorkerSpec, claim_runs
from taskward.dashboard import views
from taskward.http import HttpConfig
from taskward.limits import list_limits, set_limit
from taskward.store import StateDB
from tests.acceptance.test_dashboard_retry import (
    ADMIN,
    CSRF_META,
    READER,
    TOKENS,
    Client,
    rows,
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
    for line in table["rows"]:  # the task's cell shows its short id, the whole one as its title
        if any(c.get("title") == task_id for c in line):
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
    # The link opens the limits page on that key: its row marked, the form filled in.
    limits_page = (await client.get("/limits?key=kind%3Acommand")).text
    assert '<td class="mono chosen"><a href="/limits?key=kind%3Acommand">kind:command</a>' in (
        limits_page
    )
    assert re.search(r'name="limit_key" id="limit-limit-key" value="kind:command"', limits_page)
    assert re.search(r'name="max_running" id="limit-max-running" value="1"', limits_page)


# -- the limits page ----------------------------------------------------------------------


async def test_the_limits_page_shows_every_limit_with_what_counts_against_it(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    assert '<a href="/limits">limits</a>' in (await client.get("/")).text  # in the nav
    empty = await client.get("/limits")
    assert empty.status_code == 200 and "no limits: every key runs freely" in empty.text
    await set_limit(db, "kind:command", max_running=3)
    await set_limit(db, "tenant:acme", rate=10, period_s=60)
    await set_limit(db, "tenant:zed", max_running=0)
    await submit(db, limit_key="tenant:acme")
    await claim_runs(db, WorkerSpec(worker_id="host:dash0003", kinds=REGISTRY.kinds()), limit=1)

    regions = (await client.get("/ui/data/limits")).json()["regions"]
    table = regions["limits"]
    assert table["columns"][:7] == [
        "key",
        "max running",
        "running",
        "rate",
        "in window",
        "free",
        "state",
    ]
    shown = {line[0]["text"]: [c["text"] for c in line[1:7]] for line in table["rows"]}
    assert shown == {
        "kind:command": ["3", "1", "-", "-", "2", "2 free"],
        "tenant:acme": ["-", "-", "10 per 1m", "1", "9", "9 free"],
        "tenant:zed": ["0", "0", "-", "-", "0", "paused"],
    }
    kinds = {line[0]["text"]: line[2]["text"] for line in regions["kinds"]["rows"]}
    assert set(REGISTRY.kinds()) <= set(kinds)
    assert kinds["command"] == "limited (2 free)" and kinds["python"] == "not limited"
    page = (await client.get("/limits")).text
    assert "10 per 1m" in page and "paused" in page
    assert LIMIT_FORM.search(page)  # an operator (anonymous, no tokens) sees the forms


async def test_setting_a_limit_from_the_form_stores_it_and_says_so(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    csrf = await csrf_of(client)
    form = {
        "csrf_token": csrf,
        "limit_key": "tenant:acme",
        "max_running": "3",
        "rate": "100",
        "period_s": "1m",
    }
    r = await client.post("/limits/set", data=form)
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/limits?done=set&key=tenant%3Aacme"
    assert await limits_now(db) == [("tenant:acme", 3, 100, 60.0)]
    [stored] = await list_limits(db)
    assert stored["updated_by"] == "operator:anonymous"
    shown = await client.get(r.headers["location"])
    assert '<p class="flash" id="flash" role="status">set the limit of tenant:acme</p>' in (
        shown.text
    )
    # The form comes back filled with the key's limit, ready to change it.
    assert re.search(r'name="period_s" id="limit-period-s" value="1m"', shown.text)
    # Seconds work too, and a set replaces the key's limit whole.
    again = await client.post(
        "/limits/set", data={**form, "max_running": "", "rate": "5", "period_s": "90"}
    )
    assert again.status_code == 303
    assert await limits_now(db) == [("tenant:acme", None, 5, 90.0)]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"limit_key": ""}, "limit_key"),
        ({"limit_key": "kind:"}, "limit_key"),
        ({"limit_key": "kind:has space"}, "limit_key"),
        ({"limit_key": "x" * 256}, "limit_key"),
        ({"max_running": "-1"}, "max_running"),
        ({"max_running": "three"}, "max_running"),
        ({"max_running": "1000001"}, "max_running"),
        ({"max_running": "", "rate": "", "period_s": ""}, "max_running"),
        ({"rate": "0"}, "rate"),
        ({"rate": "2.5"}, "rate"),
        ({"rate": "5", "period_s": ""}, "rate"),
        ({"rate": "", "period_s": "60"}, "rate"),
        ({"period_s": "1x"}, "period_s"),
        ({"period_s": "0"}, "period_s"),
        ({"period_s": "400d"}, "period_s"),
        ({"period_s": "nan"}, "period_s"),
    ],
)
async def test_a_bad_limit_names_the_field_keeps_the_form_and_stores_nothing(
    client: httpx.AsyncClient, db: StateDB, changes: dict[str, str], field: str
) -> None:
    await set_limit(db, "tenant:old", max_running=2)
    before = await limits_now(db)
    form = {
        "csrf_token": await csrf_of(client),
        "limit_key": "tenant:acme",
        "max_running": "3",
        "rate": "10",
        "period_s": "60",
        **changes,
    }
    r = await client.post("/limits/set", data=form)
    assert r.status_code == 422, r.text
    error = re.search(r'<p class="error" id="limit-error" role="alert">(.*?)</p>', r.text, re.S)
    assert error and html_lib.unescape(error.group(1)).startswith(f"{field} "), r.text
    marked = re.findall(
        r'name="(\w+)" id="[^"]+" value="[^"]*" size="\d+" maxlength="255" '
        r'class="invalid" aria-invalid="true"',
        r.text,
    )
    assert marked == [field]
    for name in ("limit_key", "max_running", "rate", "period_s"):  # what was typed stays
        value = re.search(rf'name="{name}" id="[^"]+" value="([^"]*)"', r.text)
        assert value and html_lib.unescape(value.group(1)) == form[name]
    assert "tenant:old" in r.text  # the page, with its limits
    assert await limits_now(db) == before


async def test_clearing_a_limit_from_its_row(client: httpx.AsyncClient, db: StateDB) -> None:
    await set_limit(db, "tenant:a/b?c", max_running=1)
    page = (await client.get("/limits")).text
    assert re.search(
        r'<form method="post" action="/limits/clear" class="inline action">'
        r'<input type="hidden" name="csrf_token" value="[^"]+">'
        r'<input type="hidden" name="limit_key" value="tenant:a/b\?c">'
        r"<button type=\"submit\">clear</button>",
        page,
    )
    csrf = await csrf_of(client)
    r = await client.post("/limits/clear", data={"csrf_token": csrf, "limit_key": "tenant:a/b?c"})
    assert r.status_code == 303
    assert await limits_now(db) == []
    assert "cleared the limit of tenant:a/b?c" in (await client.get(r.headers["location"])).text
    again = await client.post(
        "/limits/clear", data={"csrf_token": csrf, "limit_key": "tenant:a/b?c"}
    )
    assert "tenant:a/b?c had no limit" in (await client.get(again.headers["location"])).text
    bad = await client.post("/limits/clear", data={"csrf_token": csrf, "limit_key": ""})
    assert bad.status_code == 422 and "limit_key" in bad.text


async def test_pausing_and_resuming_a_kind_from_the_kinds_table(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    queued = await submit(db)
    await set_limit(db, "kind:command", rate=5, period_s=60)
    page = (await client.get("/limits")).text
    assert re.search(
        r'<form method="post" action="/limits/pause" class="inline action">'
        r'<input type="hidden" name="csrf_token" value="[^"]+">'
        r'<input type="hidden" name="kind" value="command">',
        page,
    )
    csrf = await csrf_of(client)
    r = await client.post("/limits/pause", data={"csrf_token": csrf, "kind": "command"})
    assert r.status_code == 303
    assert r.headers["location"] == "/limits?done=paused&key=kind%3Acommand"
    assert await limits_now(db) == [("kind:command", 0, 5, 60.0)]  # the rate is kept
    shown = (await client.get(r.headers["location"])).text
    assert "paused kind:command: no new task of it starts" in shown
    regions = (await client.get("/ui/data/limits")).json()["regions"]
    command = next(line for line in regions["kinds"]["rows"] if line[0]["text"] == "command")
    assert command[2]["text"] == "paused"
    assert command[3]["actions"] == [
        {"label": "resume", "href": "/limits/resume", "fields": {"kind": "command"}}
    ]
    task_page = (await client.get(f"/tasks/{queued}")).text
    assert field_text(task_page, "placement") == (
        "held by limit kind:command \u2014 paused (max_running 0)"
    )

    r = await client.post("/limits/resume", data={"csrf_token": csrf, "kind": "command"})
    assert r.headers["location"] == "/limits?done=resumed&key=kind%3Acommand"
    assert await limits_now(db) == [("kind:command", None, 5, 60.0)]
    again = await client.post("/limits/resume", data={"csrf_token": csrf, "kind": "command"})
    assert "kind:command was not paused" in (await client.get(again.headers["location"])).text
    bad = await client.post("/limits/pause", data={"csrf_token": csrf, "kind": "two words"})
    assert bad.status_code == 422 and "kind " in bad.text
    assert await limits_now(db) == [("kind:command", None, 5, 60.0)]
    unknown = await client.post("/limits/explode", data={"csrf_token": csrf, "kind": "command"})
    assert unknown.status_code == 403


# -- who may change limits ----------------------------------------------------------------

POSTS = {
    "/limits/set": {"limit_key": "tenant:acme", "max_running": "1"},
    "/limits/clear": {"limit_key": "tenant:old"},
    "/limits/pause": {"kind": "command"},
    "/limits/resume": {"kind": "python"},
}


@pytest.mark.parametrize("path", sorted(POSTS))
async def test_a_limits_form_without_the_csrf_token_or_a_session_writes_nothing(
    client: httpx.AsyncClient, make_client: Client, db: StateDB, path: str
) -> None:
    await set_limit(db, "tenant:old", max_running=2)
    await set_limit(db, "kind:python", max_running=0)
    before = await limits_now(db)
    csrf = await csrf_of(client)
    missing = await client.post(path, data=POSTS[path])
    assert missing.status_code == 403 and "CSRF" in missing.text
    stale = await client.post(path, data={**POSTS[path], "csrf_token": "guess"})
    assert stale.status_code == 403 and "CSRF" in stale.text
    stranger = make_client()
    no_session = await stranger.post(path, data={**POSTS[path], "csrf_token": csrf})
    assert no_session.status_code == 403 and "no session" in no_session.text
    assert await limits_now(db) == before


async def test_a_read_only_session_sees_limits_without_forms_and_cannot_change_them(
    make_client: Client, db: StateDB
) -> None:
    config = HttpConfig(tokens=TOKENS, session_secret=b"s" * 32)
    await set_limit(db, "tenant:old", max_running=2)
    await set_limit(db, "kind:python", max_running=0)
    before = await limits_now(db)
    reader = make_client(config)
    assert (await reader.post("/login", data={"token": READER, "next": "/"})).status_code == 303
    page = await reader.get("/limits")
    assert page.status_code == 200 and "tenant:old" in page.text
    assert not LIMIT_FORM.search(page.text)
    assert 'action="/limits/' not in page.text  # no clear, pause or resume button either
    regions = (await reader.get("/ui/data/limits")).json()["regions"]
    for table in (regions["limits"], regions["kinds"]):
        assert all(line[-1]["actions"] == [] for line in table["rows"])
    csrf = CSRF_META.search(page.text)
    assert csrf
    for path, data in POSTS.items():
        r = await reader.post(path, data={**data, "csrf_token": csrf.group(1)})
        assert r.status_code == 403 and "lacks the &#39;operate&#39; scope" in r.text, path
    assert await limits_now(db) == before
    # Without logging in: the page asks for a login.
    stranger = make_client(config)
    assert (await stranger.get("/limits")).status_code == 303
    assert (await stranger.get("/ui/data/limits")).status_code == 401
    # An operator's change records its token name.
    operator = make_client(config)
    assert (await operator.post("/login", data={"token": ADMIN, "next": "/"})).status_code == 303
    op_page = (await operator.get("/limits")).text
    assert LIMIT_FORM.search(op_page)
    op_csrf = CSRF_META.search(op_page)
    assert op_csrf
    r = await operator.post(
        "/limits/pause", data={"kind": "command", "csrf_token": op_csrf.group(1)}
    )
    assert r.status_code == 303
    paused = {x["limit_key"]: x for x in await list_limits(db)}["kind:command"]
    assert (paused["max_running"], paused["updated_by"]) == (0, "operator:alice")
    assert await rows(db) == 0
