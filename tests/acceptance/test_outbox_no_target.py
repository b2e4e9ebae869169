"""With no delivery target configured, notifications are still written (ADR-0072 D6: with their
terminal transition) and held; the dashboard's outbox page and ``taskward outbox list`` say so
plainly, and a row that expired without ever being sent is shown neutrally, not as a failure
(docs/outbox.md, "No delivery target"). Both backends."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

import taskward
from taskward.cli.main import main
from taskward.http import HttpConfig, create_app
from taskward.outbox import (
    DEFAULT_TTL_S,
    OutboxConfig,
    OutboxDeliverer,
    no_target_notice,
    targets_configured,
)
from taskward.store.port import StateDB
from tests.integration.helpers import REGISTRY, move, submit

TARGET_VARIABLES = ("TASKWARD_WEBHOOK_URL", "TASKWARD_NOTIFY_COMMAND")


@pytest.fixture(autouse=True)
def no_target(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TARGET_VARIABLES:
        monkeypatch.delenv(name, raising=False)


async def held_and_expired(db: StateDB) -> None:
    """One notification that expired unsent (its task ended over 7 days ago), two held."""
    long_ago = await db.now() - DEFAULT_TTL_S - 60
    old = await submit(db, now=long_ago)
    await move(db, old, "queued", "cancelled", now=long_ago)
    counts = await OutboxDeliverer(db, OutboxConfig()).run_once()  # no target: expiry only
    assert counts["expired"] == 1 and counts["claimed"] == 0
    for _ in range(2):
        await move(db, await submit(db), "queued", "cancelled")


def test_the_notice_names_what_is_held_and_what_to_set() -> None:
    text = no_target_notice({"pending": 2, "expired": 1}, configured=False)
    assert text is not None
    assert text.startswith("No delivery target is configured: 2 notifications held")
    assert "expiring 7 days after its task ended; 1 expired without being sent" in text
    assert "TASKWARD_WEBHOOK_URL" in text and "TASKWARD_NOTIFY_COMMAND" in text
    # A target here, or a row some deliverer with a target attempted: nothing to say.
    assert no_target_notice({"pending": 2}, configured=True) is None
    for attempted in ("delivering", "delivered", "dead_letter"):
        assert no_target_notice({"pending": 2, attempted: 1}, configured=False) is None
    assert no_target_notice({"pending": 0, "expired": 0}, configured=False) is None
    assert targets_configured({"TASKWARD_NOTIFY_COMMAND": '["notify"]'})
    assert not targets_configured({"TASKWARD_WEBHOOK_URL": "  "})


async def test_the_outbox_page_says_no_target_is_configured(
    db: StateDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    await held_and_expired(db)
    app = create_app(db, REGISTRY, HttpConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        page = await client.get("/outbox")
        assert page.status_code == 200
        assert 'class="notice" role="status"' in page.text
        assert "No delivery target is configured: 2 notifications held" in page.text
        assert "1 expired without being sent" in page.text
        # The expired row is neutral ("never sent"), not the red of a failed delivery.
        assert re.search(r'<td class="outbox-unsent">expired \(never sent\)</td>', page.text)
        assert 'class="outbox-expired"' not in page.text
        data = (await client.get("/ui/data/outbox")).json()["regions"]
        assert data["outbox-notice"]["text"].startswith("No delivery target is configured")
        # Where a target is configured, the page does not claim otherwise.
        monkeypatch.setenv("TASKWARD_WEBHOOK_URL", "https://hooks.example/taskward")
        data = (await client.get("/ui/data/outbox")).json()["regions"]
        assert data["outbox-notice"]["text"] == ""
        page = await client.get("/outbox")
        assert "No delivery target" not in page.text


def test_outbox_list_says_no_target_is_configured(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def setup() -> None:
        async with taskward.open_db(db_url) as db:
            await held_and_expired(db)

    asyncio.run(setup())
    assert main(["--db", db_url, "outbox", "list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No delivery target is configured: 2 notifications held")
    assert "expired (never sent)" in out
    assert main(["--db", db_url, "outbox", "list", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["notice"].startswith("No delivery target is configured")
    assert len(answer["notifications"]) == 3
