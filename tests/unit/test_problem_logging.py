"""A store that is away is logged in one line per answer (an outage answers every request with
it); a store that failed otherwise keeps its traceback for the operator."""

from __future__ import annotations

import logging

import pytest

from taskward.errors import StoreError, StoreUnavailable
from taskward.web.problems import problem_for_error


@pytest.mark.parametrize(
    ("exc", "status", "traceback"),
    [(StoreUnavailable("server away"), 503, False), (StoreError("disk full"), 503, True)],
)
def test_store_failures_are_logged_with_a_traceback_only_when_unexpected(
    caplog: pytest.LogCaptureFixture, exc: StoreError, status: int, traceback: bool
) -> None:
    with caplog.at_level(logging.WARNING, logger="taskward.http"):
        answer = problem_for_error(exc, instance="/api/tasks", retry_after_s=5)
    assert answer.status_code == status and answer.headers["Retry-After"] == "5"
    [record] = [r for r in caplog.records if "store failure" in r.getMessage()]
    assert (record.exc_info is not None) is traceback
