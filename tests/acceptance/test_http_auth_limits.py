"""The limit on failed authentication (taskward.web.throttle), as a client meets it over HTTP.

A client (its peer address) that presents 10 bad bearer tokens or dashboard logins within 60 s
is answered 429 with Retry-After for 5 s, doubling per repeated block up to 60 s; while blocked
no credential is checked, so a correct token waits too (it would otherwise tell a guesser which
guess was right). Another address is unaffected. The limiter's clock is injected: no sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

import taskward
from taskward.errors import TaskValidationError
from taskward.http import HttpConfig, create_app
from taskward.store import StateDB
from taskward.web.config import parse_tokens
from taskward.web.throttle import FailureLimiter, FailureLimits, client_key

PROBLEM = "application/problem+json"
ADMIN = "admin-token-0123456789"
READER = "reader-token-0123456789"
BAD = "wrong-token-0123456789"
TOKENS = parse_tokens([f"alice:{ADMIN}:*", f"reader:{READER}:read"])
ATTACKER = "203.0.113.7"
NEIGHBOUR = "198.51.100.9"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Client = Callable[..., httpx.AsyncClient]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(db: StateDB, clock: Clock) -> FastAPI:
    config = HttpConfig(tokens=TOKENS, session_secret=b"s" * 32)
    app = create_app(db, taskward.build_registry(taskward.AdapterConfig()), config)
    app.state.taskward.auth_limiter = FailureLimiter(config.auth_limits, clock=clock)
    return app


@pytest.fixture
async def client_from(app: FastAPI) -> AsyncIterator[Client]:
    """``client_from(address, token=None)``: an httpx client whose peer address is ``address``."""
    clients: list[httpx.AsyncClient] = []

    def make(address: str, token: str | None = None) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=headers
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def fail(client: httpx.AsyncClient, times: int) -> None:
    for _ in range(times):
        r = await client.get("/api/workers", headers=bearer(BAD))
        assert r.status_code == 401, r.text


def assert_throttled(response: httpx.Response, retry_after: int) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["retry-after"] == str(retry_after)
    body: dict[str, Any] = response.json()
    assert body["type"] == "urn:taskward:problem:too-many-auth-failures"
    assert body["status"] == 429 and body["retry_after_s"] == retry_after
    assert BAD not in response.text
    return body


async def test_bad_tokens_are_429_with_retry_after_and_block_even_a_correct_one(
    client_from: Client,
) -> None:
    attacker = client_from(ATTACKER)
    await fail(attacker, 10)
    assert_throttled(await attacker.get("/api/workers", headers=bearer(BAD)), 5)
    # The documented rule: during the block no token is compared, a correct one included.
    assert_throttled(await attacker.get("/api/workers", headers=bearer(ADMIN)), 5)
    assert_throttled(await attacker.post("/api/tasks", headers=bearer(ADMIN), json={}), 5)
    # Without a token nothing is guessed: the usual 401, not a 429.
    assert (await attacker.get("/api/workers")).status_code == 401
    # /healthz needs no token and stays open.
    assert (await attacker.get("/healthz")).status_code == 200


async def test_another_address_is_unaffected(client_from: Client) -> None:
    await fail(client_from(ATTACKER), 10)
    blocked = await client_from(ATTACKER).get("/api/workers", headers=bearer(ADMIN))
    assert blocked.status_code == 429
    neighbour = client_from(NEIGHBOUR)
    assert (await neighbour.get("/api/workers", headers=bearer(ADMIN))).status_code == 200
    assert (await neighbour.get("/api/workers", headers=bearer(BAD))).status_code == 401


async def test_the_block_expires_and_grows_to_the_cap(client_from: Client, clock: Clock) -> None:
    attacker = client_from(ATTACKER)
    await fail(attacker, 10)
    clock.now += 4.5
    assert_throttled(await attacker.get("/api/workers", headers=bearer(ADMIN)), 1)
    clock.now += 0.5
    assert (await attacker.get("/api/workers", headers=bearer(ADMIN))).status_code == 200
    # Guessing again at once: each block doubles, up to 60 s.
    for expected in (10, 20, 40, 60, 60):
        await fail(attacker, 10)
        assert_throttled(await attacker.get("/api/workers", headers=bearer(BAD)), expected)
        clock.now += expected
    # A quiet window after the last block forgives it: the next block is 5 s again.
    clock.now += 61
    await fail(attacker, 10)
    assert_throttled(await attacker.get("/api/workers", headers=bearer(BAD)), 5)


async def test_failures_age_out_of_the_window(client_from: Client, clock: Clock) -> None:
    attacker = client_from(ATTACKER)
    await fail(attacker, 9)
    clock.now += 61
    await fail(attacker, 9)  # the first nine are older than the window
    clock.now += 30
    await fail(attacker, 1)
    assert (await attacker.get("/api/workers", headers=bearer(BAD))).status_code == 429


async def test_a_success_does_not_wash_out_failures(client_from: Client) -> None:
    """A caller holding a weak token cannot interleave it to keep guessing at a strong one."""
    attacker = client_from(ATTACKER)
    await fail(attacker, 9)
    assert (await attacker.get("/api/workers", headers=bearer(READER))).status_code == 200
    await fail(attacker, 1)
    assert (await attacker.get("/api/workers", headers=bearer(READER))).status_code == 429


async def test_a_dashboard_login_flood_is_429_and_shares_the_limit_with_the_api(
    client_from: Client, clock: Clock
) -> None:
    browser = client_from(ATTACKER)
    for _ in range(10):
        r = await browser.post("/login", data={"token": BAD, "next": "/"})
        assert r.status_code == 401
    r = await browser.post("/login", data={"token": ADMIN, "next": "/"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "5"
    assert r.headers["content-type"].startswith("text/html")
    assert "too many failed logins" in r.text and "try again in 5 s" in r.text
    assert "taskward_session" not in r.headers.get("set-cookie", "")
    assert r.headers["content-security-policy"]  # the dashboard's usual headers
    # The same address is blocked on the API too: both guess the same tokens.
    assert (await browser.get("/api/workers", headers=bearer(ADMIN))).status_code == 429
    # Another address logs in; and once the block is over, so does this one.
    other = await client_from(NEIGHBOUR).post("/login", data={"token": ADMIN, "next": "/"})
    assert other.status_code == 303
    clock.now += 5
    r = await browser.post("/login", data={"token": ADMIN, "next": "/tasks"})
    assert r.status_code == 303 and r.headers["location"] == "/tasks"


def test_the_table_of_clients_is_bounded_and_a_flood_cannot_wash_out_a_block() -> None:
    clock = Clock()
    limiter = FailureLimiter(FailureLimits(max_failures=2, max_clients=3), clock=clock)
    for address in ("a", "b"):
        limiter.failed(address)
        limiter.failed(address)
    assert limiter.retry_after("a") == 5 and limiter.retry_after("b") == 5
    for address in ("c", "d", "e"):  # new addresses evict the oldest client not blocked
        limiter.failed(address)
    assert len(limiter) == 3
    assert limiter.retry_after("a") == 5 and limiter.retry_after("b") == 5  # still held
    limiter.failed("e")
    assert limiter.retry_after("e") == 5
    clock.now += 6  # every block over: the least recently failed goes first again
    limiter.failed("f")
    assert list(limiter._clients) == ["b", "e", "f"]


def test_clients_are_peer_addresses_and_ipv6_counts_by_its_64() -> None:
    assert client_key("203.0.113.7") == "203.0.113.7"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::2")
    assert client_key("2001:db8:1:2::1") != client_key("2001:db8:1:3::1")
    assert client_key("::ffff:203.0.113.7") == "203.0.113.7"
    assert client_key(None) == "unknown"
    assert client_key("testclient") == "testclient"


def test_the_thresholds_are_settings_with_validated_values() -> None:
    config = HttpConfig.from_env(
        {
            "TASKWARD_AUTH_MAX_FAILURES": "3",
            "TASKWARD_AUTH_FAILURE_WINDOW_S": "30",
            "TASKWARD_AUTH_BLOCK_S": "2",
            "TASKWARD_AUTH_MAX_BLOCK_S": "20",
        }
    )
    assert config.auth_limits == FailureLimits(
        max_failures=3, window_s=30.0, block_s=2.0, max_block_s=20.0
    )
    assert HttpConfig.from_env({}).auth_limits == FailureLimits()
    for name, value in (
        ("TASKWARD_AUTH_MAX_FAILURES", "0"),
        ("TASKWARD_AUTH_MAX_FAILURES", "ten"),
        ("TASKWARD_AUTH_BLOCK_S", "nan"),
        ("TASKWARD_AUTH_MAX_BLOCK_S", "1"),  # below the first block
        ("TASKWARD_AUTH_FAILURE_WINDOW_S", "inf"),
    ):
        with pytest.raises(TaskValidationError) as caught:
            HttpConfig.from_env({name: value})
        assert caught.value.field == name
