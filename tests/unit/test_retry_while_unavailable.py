"""``retry_while_unavailable``: the first call's result at once; StoreUnavailable retried with
backoff (one warning for the streak, one for the recovery); the budget ends it with the last
StoreUnavailable; any other error raised at once, never retried."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from taskward.errors import StoreError, StoreUnavailable
from taskward.store.retry import outage_backoff, retry_while_unavailable

FAST = outage_backoff(base_s=0.001, cap_s=0.004)


def flaky(
    failures: int, error: Exception | None = None
) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def op() -> str:
        calls.append(len(calls))
        if len(calls) <= failures:
            raise error if error is not None else StoreUnavailable(f"away #{len(calls)}")
        return "done"

    return calls, op


def test_the_first_result_comes_back_after_one_call(caplog: pytest.LogCaptureFixture) -> None:
    calls, op = flaky(0)
    with caplog.at_level(logging.DEBUG, logger="taskward.store.retry"):
        assert asyncio.run(retry_while_unavailable(op, what="ack", backoff=FAST)) == "done"
    assert calls == [0]
    assert caplog.records == []


def test_unavailable_is_retried_and_logged_once_each_way(caplog: pytest.LogCaptureFixture) -> None:
    calls, op = flaky(3)
    with caplog.at_level(logging.DEBUG, logger="taskward.store.retry"):
        assert asyncio.run(retry_while_unavailable(op, what="ack", backoff=FAST)) == "done"
    assert calls == [0, 1, 2, 3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("ack failed (StoreUnavailable: away #1)")
    assert warnings[1] == "ack succeeded after 3 failed attempt(s)"


def test_the_budget_ends_it_with_the_last_unavailable() -> None:
    calls, op = flaky(10_000)
    with pytest.raises(StoreUnavailable, match=r"away #\d+") as raised:
        asyncio.run(retry_while_unavailable(op, what="ack", backoff=FAST, budget_s=0.05))
    assert 2 <= len(calls) < 10_000
    assert str(raised.value) == f"away #{len(calls)}"


def test_other_errors_are_raised_at_once() -> None:
    calls, op = flaky(5, StoreError("a constraint"))
    with pytest.raises(StoreError, match="a constraint"):
        asyncio.run(retry_while_unavailable(op, what="ack", backoff=FAST))
    assert calls == [0]
