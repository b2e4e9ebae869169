"""Operator retry from the dashboard (DESIGN.md R19), over ASGI on SQLite and PostgreSQL.

A "retry task" button on an ended task's page and "retry these" on a list filtered to an ended
status: CSRF-protected form posts needing the ``operate`` scope, each with a key drawn when the
page is rendered, so sending a form twice admits nothing new; the new task and the original
link to each other.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

import taskward
from taskward.dashboard import views
from taskward.http import HttpConfig, create_app
from taskward.reads import count_by_status
from taskward.resubmit import retry_key
from taskward.store import StateDB
from taskward.web.config import parse_tokens
from tests.integration.helpers import REGISTRY, move, submit

ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
TOKENS = parse_tokens([f"alice:{ADMIN}:*", f"reader:{READER}:read"])

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
RETRY_FORM = re.compile(
    r'<div data-region="retry" class="region region-toggle"( hidden)?>\s*'
    r'<form method="post" action="([^"]+)" id="retry-form">.*?'
    r'name="idempotency_key" value="([^"]+)"',
    re.S,
)
BULK_FORM = re.compile(
    r'<form method="post" action="/tasks/bulk-retry" id="bulk-retry-form".*?'
    r'name="idempotency_key" value="([^"]+)".*?'
    r'name="next" value="([^"]+)".*?'
    r'name="task_ids" data-region="bulk-ids" value="([^"]*)"',
    re.S,
)

# How each ended status is reached, and some that have not ended.
ENDED = {
    "completed": ("queued", "running", "completed"),
    "failed": ("queued", "running", "failed"),
    "timed_out": ("queued", "running", "timed_out"),
    "skipped": ("queued", "skipped"),
    "cancelled": ("queued", "cancelled"),
}
NOT_ENDED = {
    "queued": ("queued",),
    "running": ("queued", "running"),
    "retry_wait": ("queued", "running", "retry_wait"),
    "waiting_dependency": ("queued", "waiting_dependency"),
}

Client = Callable[..., httpx.AsyncClient]


@pytest.fixture
async def make_client(db: StateDB) -> AsyncIterator[Client]:
    """``make_client(config=None)``: a browser-like httpx client on a fresh app over ``db``."""
    clients: list[httpx.AsyncClient] = []

    def make(config: HttpConfig | None = None) -> httpx.AsyncClient:
        app = create_app(db, REGISTRY, config or HttpConfig())
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


async def rows(db: StateDB) -> int:
    return sum((await count_by_status(db)).values())


async def task_in(db: StateDB, path: tuple[str, ...]) -> str:
    task_id = await submit(db)
    await move(db, task_id, *path)
    return task_id


async def retry_form(client: httpx.AsyncClient, task_id: str) -> tuple[str, str, str, bool]:
    """(CSRF token, form action, idempotency key, whether the form is shown) of a task page."""
    page = await client.get(f"/tasks/{task_id}")
    assert page.status_code == 200, page.text
    csrf, form = CSRF_META.search(page.text), RETRY_FORM.search(page.text)
    assert csrf and form, page.text
    return csrf.group(1), form.group(2), form.group(3), form.group(1) is None


async def bulk_form(client: httpx.AsyncClient, query: str) -> dict[str, str] | None:
    """The bulk retry form's fields on ``/tasks?<query>``, or None when there is none."""
    page = await client.get(f"/tasks?{query}")
    assert page.status_code == 200, page.text
    csrf, form = CSRF_META.search(page.text), BULK_FORM.search(page.text)
    assert csrf
    if form is None:
        return None
    return {
        "csrf_token": csrf.group(1),
        "idempotency_key": form.group(1),
        "next": form.group(2).replace("&amp;", "&"),
        "task_ids": form.group(3),
    }


async def run_row(db: StateDB, task_id: str) -> dict[str, Any]:
    row = await db.fetchone("run_get", {"id": task_id})
    assert row is not None
    return row


# -- one task, from its page --------------------------------------------------------------


@pytest.mark.parametrize("status", sorted(ENDED))
async def test_an_ended_task_shows_the_retry_button(
    client: httpx.AsyncClient, db: StateDB, status: str
) -> None:
    task_id = await task_in(db, ENDED[status])
    _, action, key, shown = await retry_form(client, task_id)
    assert shown and action == f"/tasks/{task_id}/retry" and key.startswith("ui:")
    data = (await client.get(f"/ui/data/tasks/{task_id}")).json()["regions"]
    assert data["retry"] == {"kind": "toggle", "visible": True}


@pytest.mark.parametrize("status", sorted(NOT_ENDED))
async def test_a_task_that_has_not_ended_shows_no_retry_button(
    client: httpx.AsyncClient, db: StateDB, status: str
) -> None:
    """The form is there but hidden (the page reveals it when the task ends, while it polls)."""
    task_id = await task_in(db, NOT_ENDED[status])
    _, _, _, shown = await retry_form(client, task_id)
    assert not shown
    data = (await client.get(f"/ui/data/tasks/{task_id}")).json()["regions"]
    assert data["retry"] == {"kind": "toggle", "visible": False}


async def test_retry_from_the_page_admits_one_new_task_and_goes_to_it(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    original = await task_in(db, ENDED["failed"])
    before = await run_row(db, original)
    csrf, action, key, _ = await retry_form(client, original)
    form = {"csrf_token": csrf, "idempotency_key": key}
    r = await client.post(action, data=form)
    assert r.status_code == 303, r.text
    new_id = r.headers["location"].removeprefix("/tasks/")
    assert new_id != original
    row = await run_row(db, new_id)
    assert row["status"] == "queued"
    assert row["idempotency_key"] == retry_key(original, key) == f"retry:{original}:{key}"
    assert (row["chain_parent_id"], row["chain_depth"], row["admission_source"]) == (
        original,
        1,
        "retry",
    )
    assert row["trigger_context"] == {"retry_of": original, "actor": "operator:anonymous"}
    assert await rows(db) == 2
    # The same form sent again (a double submit, a reload) is the same new task.
    again = await client.post(action, data=form)
    assert again.status_code == 303 and again.headers["location"] == f"/tasks/{new_id}"
    assert await rows(db) == 2
    assert await run_row(db, original) == before  # the original never changes
    page = await client.get(r.headers["location"])
    assert page.status_code == 200 and new_id in page.text
    # A fresh render draws a fresh key: a second retry on purpose is another task.
    csrf, action, other_key, _ = await retry_form(client, original)
    assert other_key != key
    third = await client.post(action, data={"csrf_token": csrf, "idempotency_key": other_key})
    assert third.headers["location"] not in (f"/tasks/{new_id}", f"/tasks/{original}")
    assert await rows(db) == 3


async def test_a_retry_without_the_csrf_token_or_a_session_is_refused_and_writes_nothing(
    client: httpx.AsyncClient, make_client: Client, db: StateDB
) -> None:
    original = await task_in(db, ENDED["failed"])
    csrf, action, key, _ = await retry_form(client, original)
    missing = await client.post(action, data={"idempotency_key": key})
    assert missing.status_code == 403 and "CSRF" in missing.text
    stale = await client.post(action, data={"csrf_token": "guess", "idempotency_key": key})
    assert stale.status_code == 403 and "CSRF" in stale.text
    header_guess = await client.post(
        action, data={"idempotency_key": key}, headers={"X-CSRF-Token": "guess"}
    )
    assert header_guess.status_code == 403
    stranger = make_client()  # no session cookie: the token of another's page is no use
    no_session = await stranger.post(action, data={"csrf_token": csrf, "idempotency_key": key})
    assert no_session.status_code == 403 and "no session" in no_session.text
    assert await rows(db) == 1
    assert (
        await db.fetchone("run_get_by_key", {"idempotency_key": retry_key(original, key)}) is None
    )


async def test_a_read_only_session_cannot_retry_and_an_operator_is_recorded(
    make_client: Client, db: StateDB
) -> None:
    config = HttpConfig(tokens=TOKENS, session_secret=b"s" * 32)
    original = await task_in(db, ENDED["failed"])
    reader = make_client(config)
    assert (await reader.post("/login", data={"token": READER, "next": "/"})).status_code == 303
    page = await reader.get(f"/tasks/{original}")
    assert page.status_code == 200
    assert 'id="retry-form"' not in page.text  # no button without the operate scope
    csrf = CSRF_META.search(page.text)
    assert csrf
    form = {"csrf_token": csrf.group(1), "idempotency_key": "ui:by-hand"}
    refused = await reader.post(f"/tasks/{original}/retry", data=form)
    assert refused.status_code == 403 and "lacks the &#39;operate&#39; scope" in refused.text
    bulk = await reader.post(
        "/tasks/bulk-retry", data={**form, "task_ids": original, "next": "/tasks"}
    )
    assert bulk.status_code == 403 and "lacks the &#39;operate&#39; scope" in bulk.text
    assert await rows(db) == 1
    # Without logging in, the page is a login redirect and a post has no session.
    anonymous = make_client(config)
    assert (await anonymous.get(f"/tasks/{original}")).status_code == 303
    assert (await anonymous.post(f"/tasks/{original}/retry", data=form)).status_code == 403
    assert await rows(db) == 1
    operator = make_client(config)
    assert (await operator.post("/login", data={"token": ADMIN, "next": "/"})).status_code == 303
    csrf_value, action, key, shown = await retry_form(operator, original)
    assert shown
    r = await operator.post(action, data={"csrf_token": csrf_value, "idempotency_key": key})
    assert r.status_code == 303
    row = await run_row(db, r.headers["location"].removeprefix("/tasks/"))
    assert row["trigger_context"]["actor"] == "operator:alice"


async def test_posting_a_retry_of_a_task_that_has_not_ended_is_a_409_page(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    queued = await submit(db)
    csrf, action, key, shown = await retry_form(client, queued)
    assert not shown
    r = await client.post(action, data={"csrf_token": csrf, "idempotency_key": key})
    assert r.status_code == 409
    assert r.headers["content-type"].startswith("text/html")
    assert "Not retryable" in r.text and "only a terminal task" in r.text
    missing = await client.post(
        "/tasks/no-such-task/retry", data={"csrf_token": csrf, "idempotency_key": key}
    )
    assert missing.status_code == 404
    bad_key = await client.post(action, data={"csrf_token": csrf, "idempotency_key": "a\tb"})
    assert bad_key.status_code == 422
    assert await rows(db) == 1


# -- links both ways ----------------------------------------------------------------------


async def test_a_retry_and_its_original_link_to_each_other(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    original = await task_in(db, ENDED["failed"])
    page = await client.get(f"/tasks/{original}")
    assert "Retry of" not in page.text
    assert re.search(r'data-region="retried" class="region region-toggle" hidden', page.text)
    csrf, action, key, _ = await retry_form(client, original)
    new_id = (
        (await client.post(action, data={"csrf_token": csrf, "idempotency_key": key}))
        .headers["location"]
        .removeprefix("/tasks/")
    )
    await move(db, new_id, "queued", "cancelled")
    second = await taskward.retry_task(
        db,
        original,
        actor=taskward.Actor(type="operator", id="cli"),
        idempotency_key="by-cli",
        registry=REGISTRY,
    )

    retry_page = (await client.get(f"/tasks/{new_id}")).text
    assert re.search(
        rf'Retry of <span class="mono" data-region="retry-of"><a href="/tasks/{original}">'
        rf"{original}</a>",
        retry_page,
    )
    twin = (await client.get(f"/ui/data/tasks/{new_id}")).json()["regions"]
    assert twin["retry-of"] == {"kind": "link", "text": original, "href": f"/tasks/{original}"}

    original_page = (await client.get(f"/tasks/{original}")).text
    retried = original_page.split('data-region="retried"', 1)[1]
    assert retried.startswith(' class="region region-toggle">')  # shown
    assert "Retried as" in retried
    links = re.findall(r'<a href="/tasks/([^"]+)">', retried)
    assert links == [new_id, second]  # oldest first
    assert retry_key(original, "by-cli") in retried
    # A task that is no retry links nowhere; one retried from a retry links to its parent.
    assert "Retry of" not in original_page
    third = await taskward.retry_task(
        db,
        new_id,
        actor=taskward.Actor(type="operator", id="cli"),
        idempotency_key="x",
        registry=REGISTRY,
    )
    assert f'<a href="/tasks/{new_id}">' in (await client.get(f"/tasks/{third}")).text
    new_page = (await client.get(f"/tasks/{new_id}")).text
    assert re.findall(
        r'<a href="/tasks/([^"]+)">', new_page.split('data-region="retried"', 1)[1]
    ) == [third]


# -- every task a list page shows ---------------------------------------------------------


async def test_bulk_retry_of_a_failed_list_retries_each_shown_task_once(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    failed = [await task_in(db, ENDED["failed"]) for _ in range(3)]
    await task_in(db, ENDED["completed"])
    queued = await submit(db)
    form = await bulk_form(client, "status=failed")
    assert form is not None
    assert form["task_ids"].split() == failed[::-1]  # as listed, newest first
    assert form["next"] == "/tasks?status=failed"
    assert form["idempotency_key"].startswith("ui:bulk:")
    page = await client.get("/tasks?status=failed")
    assert re.search(r'<span data-region="bulk-count">3</span>', page.text)
    total = await rows(db)

    r = await client.post("/tasks/bulk-retry", data=form)
    assert r.status_code == 200, r.text
    assert "Retried 3 of 3 tasks" in r.text
    key = form["idempotency_key"]
    new_ids = []
    for original in failed:
        found = await db.fetchone("run_get_by_key", {"idempotency_key": retry_key(original, key)})
        assert found is not None
        row = await run_row(db, found["id"])
        assert (row["chain_parent_id"], row["admission_source"]) == (original, "retry")
        assert row["trigger_context"]["actor"] == "operator:anonymous"
        assert f'<a href="/tasks/{original}">' in r.text
        assert f'<a href="/tasks/{found["id"]}">' in r.text
        new_ids.append(found["id"])
    assert await rows(db) == total + 3
    assert 'href="/tasks?status=failed"' in r.text

    # The same form again: the same new tasks, nothing admitted.
    again = await client.post("/tasks/bulk-retry", data=form)
    assert again.status_code == 200 and "Retried 3 of 3 tasks" in again.text
    assert all(f'<a href="/tasks/{n}">' in again.text for n in new_ids)
    assert await rows(db) == total + 3

    # A task that has not ended (here, sent by hand) is skipped and counted.
    crafted = {**form, "task_ids": f"{failed[0]} {queued} no-such-task {failed[0]}"}
    mixed = await client.post("/tasks/bulk-retry", data=crafted)
    assert mixed.status_code == 200
    assert "Retried 1 of 3 tasks" in mixed.text
    assert "Skipped: not ended (1)" in mixed.text and f"{queued}</a> is queued" in mixed.text
    assert "Skipped: not found (1)" in mixed.text
    assert await rows(db) == total + 3


async def test_bulk_retry_is_offered_only_on_a_list_filtered_to_an_ended_status(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    cancelled = await task_in(db, ENDED["cancelled"])
    await submit(db)
    for query in ("", "status=queued", "status=running", "kind=command"):
        assert await bulk_form(client, query) is None, query
    form = await bulk_form(client, "status=cancelled&kind=command")
    assert form is not None and form["task_ids"] == cancelled
    assert form["next"] == "/tasks?status=cancelled&kind=command"
    empty = await client.get("/tasks?status=timed_out")  # nothing to retry: hidden
    assert re.search(r'data-region="bulk-retry" class="region region-toggle" hidden', empty.text)
    # The page's twin keeps the ids current while it polls.
    later = await task_in(db, ENDED["cancelled"])
    twin = (await client.get("/ui/data/tasks?status=cancelled")).json()["regions"]
    assert twin["bulk-ids"] == {"kind": "value", "value": f"{later} {cancelled}"}
    assert twin["bulk-count"] == {"kind": "text", "text": "2"}
    assert twin["bulk-retry"] == {"kind": "toggle", "visible": True}
    assert "bulk-ids" not in (await client.get("/ui/data/tasks?status=queued")).json()["regions"]


async def test_bulk_retry_without_the_csrf_token_or_over_a_page_writes_nothing(
    client: httpx.AsyncClient, db: StateDB
) -> None:
    failed = await task_in(db, ENDED["failed"])
    form = await bulk_form(client, "status=failed")
    assert form is not None
    missing = await client.post("/tasks/bulk-retry", data={**form, "csrf_token": ""})
    assert missing.status_code == 403
    stale = await client.post("/tasks/bulk-retry", data={**form, "csrf_token": "guess"})
    assert stale.status_code == 403
    too_many = " ".join([failed] + [f"id-{i}" for i in range(views.PAGE_SIZE)])
    over = await client.post("/tasks/bulk-retry", data={**form, "task_ids": too_many})
    assert over.status_code == 422 and "task_ids" in over.text
    assert await rows(db) == 1
