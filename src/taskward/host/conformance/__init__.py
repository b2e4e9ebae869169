"""The ADR-0037 D6 conformance suite: ten cases any TaskSource / SummaryStore pair can run, and
``OPTIONAL_CASES`` for the optional ports (lease renewal, ``RenewsLeases``: protocol version
two, DESIGN.md R25), which an implementation runs when it has them.

An implementation provides a :class:`ConformanceHarness` (enqueue work, make claimers, let a
lease lapse, set the attempt ceiling, observe queue and summary state); each case drives the
ports through :class:`~taskward.host.ResidentEngineHost` or calls them directly, and raises
:class:`ConformanceFailure` naming the broken rule. Cases use only the ports and the harness,
never an implementation's internals, and never sleep to wait for state: they poll a condition
with a timeout. Known limit: ``expire_lease`` may lapse other short leases too, so the cases call
it only while the task it names is the one leased task.

Usage from a test suite::

    @pytest.mark.parametrize("case", CONFORMANCE_CASES, ids=str)
    async def test_my_ports_conform(case, my_harness):
        await case.run(my_harness)

or ``await run_conformance(my_harness_factory)`` for all ten at once (``cases=OPTIONAL_CASES``
for the optional ones: the harness must then implement ``make_renewing_source``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Final

from taskward.host.conformance.claiming import (
    concurrent_claimers_yield_one_lease_winner,
    fresh_session_per_concurrent_task,
    identical_acknowledgement_retries_are_idempotent,
    invalid_cwd_and_short_lease_rejected,
    stale_lease_rejected_after_reclaim,
)
from taskward.host.conformance.finishing import (
    attempt_ceiling_dead_letters_poison_work,
    deadline_cancellation_and_crash_reclaim,
    stop_claiming_drains_without_cancelling,
    summary_failure_is_pending_and_failed_never_completed,
    summary_written_before_complete,
)
from taskward.host.conformance.harness import (
    CallLog,
    ConformanceFailure,
    ConformanceHarness,
    ConformanceSession,
    PortCall,
    QueueState,
    RecordingRenewingSource,
    RecordingSummaryStore,
    RecordingTaskSource,
    SummaryOutage,
    SummaryState,
    wait_until,
)
from taskward.host.conformance.renewing import (
    lease_renewal_extends_the_held_lease_and_a_lost_lease_stops_its_run,
)

__all__ = [
    "CONFORMANCE_CASES",
    "CallLog",
    "CaseReport",
    "ConformanceCase",
    "ConformanceFailure",
    "ConformanceHarness",
    "ConformanceSession",
    "OPTIONAL_CASES",
    "PortCall",
    "QueueState",
    "RecordingRenewingSource",
    "RecordingSummaryStore",
    "RecordingTaskSource",
    "SummaryOutage",
    "SummaryState",
    "run_conformance",
    "wait_until",
]


# -- the suite ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConformanceCase:
    """One case: a required case of ADR-0037 D6, or an optional port's."""

    name: str
    run: Callable[[ConformanceHarness], Awaitable[None]]

    def __str__(self) -> str:
        return self.name


CONFORMANCE_CASES: Final[tuple[ConformanceCase, ...]] = tuple(
    ConformanceCase(fn.__name__, fn)
    for fn in (
        concurrent_claimers_yield_one_lease_winner,
        fresh_session_per_concurrent_task,
        identical_acknowledgement_retries_are_idempotent,
        stale_lease_rejected_after_reclaim,
        invalid_cwd_and_short_lease_rejected,
        summary_written_before_complete,
        summary_failure_is_pending_and_failed_never_completed,
        deadline_cancellation_and_crash_reclaim,
        attempt_ceiling_dead_letters_poison_work,
        stop_claiming_drains_without_cancelling,
    )
)


# The cases of the optional ports, one per port: an implementation without the port still
# conforms (the ten above), one with it runs its case too.
OPTIONAL_CASES: Final[tuple[ConformanceCase, ...]] = tuple(
    ConformanceCase(fn.__name__, fn)
    for fn in (lease_renewal_extends_the_held_lease_and_a_lost_lease_stops_its_run,)
)


@dataclass(frozen=True)
class CaseReport:
    name: str
    passed: bool
    elapsed_s: float
    error: BaseException | None = None


async def run_conformance(
    harness_factory: Callable[[], AbstractAsyncContextManager[ConformanceHarness]],
    *,
    cases: Sequence[ConformanceCase] = CONFORMANCE_CASES,
    case_timeout_s: float = 30.0,
    raise_on_failure: bool = True,
) -> list[CaseReport]:
    """Run each case against a fresh harness from ``harness_factory``.

    Raises:
        ConformanceFailure: listing every failed case, unless ``raise_on_failure`` is False.
    """
    reports: list[CaseReport] = []
    for case in cases:
        started = time.monotonic()
        error: BaseException | None = None
        try:
            async with harness_factory() as harness:
                await asyncio.wait_for(case.run(harness), case_timeout_s)
        except Exception as exc:
            error = exc
        reports.append(CaseReport(case.name, error is None, time.monotonic() - started, error))
    failed = [r for r in reports if not r.passed]
    if failed and raise_on_failure:
        lines = "\n".join(f"- {r.name}: {r.error!r}" for r in failed)
        raise ConformanceFailure(f"{len(failed)} of {len(reports)} cases failed:\n{lines}")
    return reports
