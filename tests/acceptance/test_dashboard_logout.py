"""Logging out of the dashboard revokes the session in the store (migration 0010).

A copy of the session cookie saved before logout is refused afterwards, by the app that saw the
logout and by another app on the same store (as another ``taskward serve`` process would be);
other sessions of the same token go on working. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import FastAPI

import taskward
from taskward.dashboard.session import SESSION_COOKIE, Session, revoke_session
from taskward.http import HttpConfig, create_app
from taskward.store import StateDB
from taskward.web.config import parse_tokens

ADMIN = "admin-token-0123456789"
CONFIG = HttpConfig(tokens=parse_tokens([f"alice:{ADMIN}:*"]), session_secret=b"s" * 32)
CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')

Client = Callable[..., httpx.AsyncClient]


def registry() -> taskward.TaskAdapterRegistry:
    return taskward.build_registry(taskward.AdapterConfig(command_allowlist=frozenset({"echo"})))


@pytest.fixture
async def client_of() -> AsyncIterator[Client]:
    """``client_of(app, cookie=None)``: a browser-like httpx client of ``app``."""
    clients: list[httpx.AsyncClient] = []

    def make(app: FastAPI, cookie: str | None = None) -> httpx.AsyncClient:
        headers = {"Cookie": f"{SESSION_COOKIE}={cookie}"} if cookie else {}
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost", headers=headers
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def log_in(browser: httpx.AsyncClient) -> str:
    r = await browser.post("/login", data={"token": ADMIN, "next": "/"})
    assert r.status_code == 303
    cookie = browser.cookies.get(SESSION_COOKIE)
    assert cookie
    return cookie


async def csrf_of(browser: httpx.AsyncClient) -> str:
    page = await browser.get("/workers")
    assert page.status_code == 200, page.text
    found = CSRF_META.search(page.text)
    assert found
    return found.group(1)


async def assert_refused(browser: httpx.AsyncClient, csrf: str) -> None:
    page = await browser.get("/workers")
    assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
    assert (await browser.get("/ui/data/workers")).status_code == 401
    cancel = await browser.post("/tasks/nope/cancel", data={"csrf_token": csrf})
    assert cancel.status_code == 403 and "no session" in cancel.text


async def test_a_cookie_saved_before_logout_is_refused_after_it(
    db: StateDB, db_url: str, client_of: Client
) -> None:
    app = create_app(db, registry(), CONFIG)
    other_process = create_app(db_url, registry(), CONFIG)  # its own store connection
    browser = client_of(app)
    saved = await log_in(browser)
    csrf = await csrf_of(browser)
    other_session = await log_in(client_of(app))
    assert other_session != saved
    # The saved copy works in both apps while the session is live.
    assert (await client_of(other_process, saved).get("/workers")).status_code == 200

    r = await browser.post("/logout", data={"csrf_token": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert SESSION_COOKIE not in browser.cookies  # the browser's own copy is cleared

    await assert_refused(client_of(app, saved), csrf)
    await assert_refused(client_of(other_process, saved), csrf)
    # Other sessions of the same token go on working.
    assert (await client_of(app, other_session).get("/workers")).status_code == 200
    assert (await client_of(other_process, other_session).get("/workers")).status_code == 200
    # Logging in again gives a new session that works.
    assert (await client_of(app, await log_in(client_of(app))).get("/workers")).status_code == 200
    await other_process.state.taskward.store.close()  # the store it opened


async def test_a_logout_without_the_csrf_token_revokes_nothing(
    db: StateDB, client_of: Client
) -> None:
    app = create_app(db, registry(), CONFIG)
    browser = client_of(app)
    saved = await log_in(browser)
    r = await browser.post("/logout", data={})
    assert r.status_code == 403
    assert (await client_of(app, saved).get("/workers")).status_code == 200


async def test_revocations_are_kept_only_until_the_session_would_expire(db: StateDB) -> None:
    now = time.time()
    expired = Session(name="alice", csrf="c1", expires_at=now - 1, id="expired-session")
    live = Session(name="alice", csrf="c2", expires_at=now + 3600, id="live-session")
    await revoke_session(db, expired)
    assert await db.fetchone("session_revoked", {"session_id": "expired-session"})
    await revoke_session(db, live)  # each logout drops the revocations that expired
    assert await db.fetchone("session_revoked", {"session_id": "expired-session"}) is None
    assert await db.fetchone("session_revoked", {"session_id": "live-session"})
    await revoke_session(db, live)  # twice is harmless
    assert await db.fetchone("session_revoked", {"session_id": "live-session"})
