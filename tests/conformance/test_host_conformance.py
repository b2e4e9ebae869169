"""ADR-0037 D6: the in-tree LocalTaskSource and LocalSummaryStore pass the reusable conformance
suite (``taskward.testing``) on both backends, the optional lease-renewal case (R25) too.

Nothing sleeps: a crash-style lease expiry moves the stored ``lease_expires_at`` to just before
the store's clock and runs the reaper on that clock (R6: expired when ``lease_expires_at < now``).
The reaper never runs at an injected future time: R16, a claim takes only rows queued by its own
time, so a row requeued in the future would not be due for the next claim.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.claims import WorkerSpec
from taskward.execution import RetryPolicy
from taskward.host import LocalSummaryStore, LocalTaskSource, SummaryStore, TaskSource
from taskward.maintenance.reaper import promote_due_retries, reap_expired_leases
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB
from taskward.testing import (
    CONFORMANCE_CASES,
    OPTIONAL_CASES,
    ConformanceCase,
    ConformanceHarness,
    QueueState,
    SummaryState,
    run_conformance,
)
from tests.integration.helpers import lapse_lease

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))
# Retries are due at once; release_retries() promotes them on the store clock.
IMMEDIATE = RetryPolicy(base_s=0.0, jitter=0.0)
# Short, but never lapsing during a case: expiry is always injected.
LEASE_TTL_S = 20.0
DEFAULT_TIMEOUT_S = 15.0
LEASE_SLACK_S = 2.0
DEAD_LETTER_REASONS = frozenset({"attempt_ceiling", "attempts_exhausted"})


class LocalHarness(ConformanceHarness):
    """The conformance harness over one real store; each source is another worker with its own
    connection to the store."""

    def __init__(self, db: StateDB, db_url: str) -> None:
        self.db = db
        self.db_url = db_url
        self._summaries = LocalSummaryStore(db)
        self._stores: list[StateDB] = []

    @property
    def summaries(self) -> SummaryStore:
        return self._summaries

    async def enqueue(
        self,
        *,
        objective: str | None = None,
        cwd: Path | None = None,
        timeout_s: float | None = None,
    ) -> str:
        args: dict[str, object] = {"argv": ["true"]}
        if objective is not None:
            args["objective"] = objective
        if cwd is not None:
            args["cwd"] = str(cwd)
        if timeout_s is not None:
            args["timeout_s"] = timeout_s
        app = taskward.TaskApplication(
            action_kind="command",
            args=args,
            execution_target="host",
            idempotency_key=f"conformance-{uuid.uuid4()}",
        )
        return await taskward.submit_task(self.db, app, registry=REGISTRY)

    async def make_source(self, *, renews: bool = False) -> TaskSource:
        store = await taskward.open_db(self.db_url)
        self._stores.append(store)
        spec = WorkerSpec(
            worker_id=f"host:{len(self._stores):08x}",
            kinds=REGISTRY.kinds(),
            lease_ttl=LEASE_TTL_S,
            default_timeout_s=DEFAULT_TIMEOUT_S,
            lease_slack_s=LEASE_SLACK_S,
            renews=renews,
        )
        return LocalTaskSource(store, spec, retry_policy=IMMEDIATE)

    async def make_renewing_source(self) -> TaskSource:
        """A worker that renews its leases (R25): its claims grant LEASE_TTL_S alone."""
        return await self.make_source(renews=True)

    async def expire_lease(self, task_id: str) -> None:
        row = await taskward.get_task(self.db, task_id)
        assert row["status"] == "running", row
        # The lease runs out now, then the queue's own recovery runs on the store's clock.
        await lapse_lease(self.db, task_id)
        await reap_expired_leases(self.db, retry_policy=IMMEDIATE)
        await promote_due_retries(self.db)

    async def release_retries(self) -> None:
        await promote_due_retries(self.db)

    async def set_ceiling(self, attempts: int) -> None:
        # R18: the ceiling of the tasks admitted from now on; each row keeps its own
        await set_max_attempts(self.db, attempts)

    async def status(self, task_id: str) -> QueueState:
        row = await taskward.get_task(self.db, task_id)
        status = row["status"]
        if status in {"queued", "retry_wait", "waiting_dependency"}:
            return "queued"
        if status == "running":
            return "leased"
        if status == "completed":
            return "completed"
        if status in {"failed", "timed_out"}:
            if row["status_reason_code"] in DEAD_LETTER_REASONS:
                return "dead_letter"
            return "terminal_failed"
        return "cancelled"

    async def history(self, task_id: str) -> Sequence[str]:
        return [f["status"] for f in await taskward.list_transitions(self.db, task_id)]

    async def summary_state(self, session_key: str) -> SummaryState | None:
        row = await self._summaries.get(session_key)
        if row is None:
            return None
        state: SummaryState = row["state"]
        return state

    async def aclose(self) -> None:
        for store in self._stores:
            await store.close()
        self._stores.clear()


@pytest.fixture
async def harness(db: StateDB, db_url: str) -> AsyncIterator[LocalHarness]:
    local = LocalHarness(db, db_url)
    try:
        yield local
    finally:
        await local.aclose()


def test_the_suite_has_the_ten_cases_of_d6() -> None:
    assert len(CONFORMANCE_CASES) == 10
    assert len({case.name for case in CONFORMANCE_CASES}) == 10


@pytest.mark.parametrize("case", CONFORMANCE_CASES, ids=str)
async def test_local_ports_pass_conformance_case(
    harness: LocalHarness, case: ConformanceCase
) -> None:
    await case.run(harness)


@pytest.mark.parametrize("case", OPTIONAL_CASES, ids=str)
async def test_local_ports_pass_the_optional_ports_case(
    harness: LocalHarness, case: ConformanceCase
) -> None:
    """LocalTaskSource has the optional renewal port (R25): it runs that case too."""
    await case.run(harness)


async def test_a_harness_without_a_renewing_source_says_so() -> None:
    """Renewal is optional: a harness that does not make a renewing source conforms to the ten
    cases, and the optional case fails naming why instead of passing vacuously."""

    class Plain(LocalHarness):
        make_renewing_source = ConformanceHarness.make_renewing_source

    with pytest.raises(NotImplementedError, match="renewal is optional"):
        await OPTIONAL_CASES[0].run(Plain.__new__(Plain))


async def test_run_conformance_reports_each_case_against_a_fresh_harness(
    stores: object, db_url: str
) -> None:
    opened: list[LocalHarness] = []

    @asynccontextmanager
    async def factory() -> AsyncIterator[ConformanceHarness]:
        async with taskward.open_db(db_url) as store:
            local = LocalHarness(store, db_url)
            opened.append(local)
            try:
                yield local
            finally:
                await local.aclose()

    reports = await run_conformance(factory, cases=CONFORMANCE_CASES[:1])
    assert [(r.name, r.passed) for r in reports] == [(CONFORMANCE_CASES[0].name, True)]
    assert len(opened) == 1
