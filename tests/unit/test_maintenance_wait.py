"""The worker's maintenance loop waits its interval, or less when a lease expiry or a retry
comes first (issue 27's kill storm: an orphan is reaped as its lease expires and queued as its
backoff ends, not up to an interval after each)."""

from __future__ import annotations

import pytest

from taskward.runtime import DUE_MARGIN_S, MIN_MAINTENANCE_WAIT_S, maintenance_wait


@pytest.mark.parametrize(
    ("interval", "due_in", "expected"),
    [
        (1.0, None, 1.0),  # nothing running or waiting: the interval
        (1.0, 5.0, 1.0),  # due after the interval: the interval
        (1.0, 0.3, 0.3 + DUE_MARGIN_S),  # due first: just after it (R6: expiry is strict)
        (1.0, 0.0, MIN_MAINTENANCE_WAIT_S),  # due now (rows left by a full batch): soon, no spin
        (1.0, -4.0, MIN_MAINTENANCE_WAIT_S),
        (0.01, -4.0, 0.01),  # never longer than the interval
    ],
)
def test_maintenance_wait(interval: float, due_in: float | None, expected: float) -> None:
    assert maintenance_wait(interval, due_in) == pytest.approx(expected)
