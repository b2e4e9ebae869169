"""This process's metrics: what its admissions, claims, acknowledgements, lease reaper and
outbox deliverer did, as ``prometheus-client`` counters and histograms in a
``CollectorRegistry`` of its own (never the global default one: a test process runs many).

A ``TaskMetrics`` is recorded through the store its process opened (``StateDB.metrics``, set by
whoever owns it: ``WorkerRuntime``, ``create_app``), the way the store carries its wake-up
signals: each event is recorded at one place -- ``admission`` (admissions),
``host.source`` (claims with their queue wait; acknowledged ends with their run time and the
retries they schedule), ``maintenance.leases`` (lease expiries and their retries),
``outbox.deliverer`` (deliveries) -- after its transaction committed, so a group commit that
rolls back and runs again alone counts once. The labelled children are cached per label
values: a task costs a dict lookup and a few ``inc``/``observe`` calls.

Imports nothing of taskward and no web stack; exposition is ``prometheus_client``'s own
(``taskward.exposition``: the service's ``/metrics`` and a worker's ``--metrics-port``).
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram

# Queue wait (queued -> running): from milliseconds on an idle worker to an hour of backlog.
QUEUE_WAIT_BUCKETS_S: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
# Run time (running -> an acknowledged end): the old execution histogram's buckets.
RUN_BUCKETS_S: Final[tuple[float, ...]] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
)  # fmt: skip
# The statuses an acknowledged end may leave a row in that end the task (lifecycle.TERMINAL
# minus `skipped`, which no running row takes); `retry_wait` is an end of an attempt only.
_ENDS_TASK: Final = frozenset({"completed", "failed", "timed_out", "cancelled"})


class TaskMetrics:
    """One process's counters and histograms (see the module docstring); ``registry`` is what
    an exposition collects."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.admissions = Counter(
            "taskward_task_admissions",
            "Admissions by this process, by kind and outcome (new: a row inserted; existing: "
            "a replayed key answered with its task).",
            ("kind", "outcome"),
            registry=r,
        )
        self.claims = Counter(
            "taskward_task_claims",
            "Tasks claimed by this process's workers.",
            ("kind",),
            registry=r,
        )
        self.completions = Counter(
            "taskward_task_completions",
            "Tasks this process's workers ended, by kind and terminal status.",
            ("kind", "status"),
            registry=r,
        )
        self.queue_wait = Histogram(
            "taskward_task_queue_wait_seconds",
            "Time from queued (or due, for a delayed task) to its claim, by kind.",
            ("kind",),
            buckets=QUEUE_WAIT_BUCKETS_S,
            registry=r,
        )
        self.run_time = Histogram(
            "taskward_task_run_seconds",
            "Time from claim to the acknowledged end of an attempt, by kind and the status it "
            "left the task in (retry_wait included).",
            ("kind", "status"),
            buckets=RUN_BUCKETS_S,
            registry=r,
        )
        self.lease_expiries = Counter(
            "taskward_task_lease_expiries",
            "Expired leases this process's reaper recovered, by kind and outcome "
            "(retry_wait or failed).",
            ("kind", "outcome"),
            registry=r,
        )
        self.retries = Counter(
            "taskward_task_retries_scheduled",
            "Attempts sent to retry_wait by this process, by kind and cause (failure: a "
            "retryable failure acknowledged; lease_expired: the reaper).",
            ("kind", "cause"),
            registry=r,
        )
        self.outbox_deliveries = Counter(
            "taskward_outbox_deliveries",
            "Outbox delivery outcomes of this process's deliverer (delivered, failed, "
            "dead_letter, expired, lost).",
            ("outcome",),
            registry=r,
        )
        self.http_admissions = Counter(
            "taskward_http_admissions",
            "POST /api/tasks answers of this process, by outcome (rejected ones included).",
            ("outcome",),
            registry=r,
        )
        self._claim_children: dict[str, tuple[Any, Any]] = {}
        self._end_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def admitted(self, kind: str, *, created: bool) -> None:
        """An admission answered: a new row, or a replayed key's existing one."""
        self.admissions.labels(kind, "new" if created else "existing").inc()

    def claimed(self, kind: str, wait_s: float) -> None:
        """A claim committed, ``wait_s`` after its row was queued (or due)."""
        children = self._claim_children.get(kind)
        if children is None:
            children = (self.claims.labels(kind), self.queue_wait.labels(kind))
            self._claim_children[kind] = children
        children[0].inc()
        children[1].observe(wait_s if wait_s > 0.0 else 0.0)

    def ended(self, kind: str, status: str, run_s: float | None) -> None:
        """An attempt's acknowledgement committed, leaving the row in ``status``; ``run_s``
        None: its claim is not this process's (no run time observed)."""
        key = (kind, status)
        children = self._end_children.get(key)
        if children is None:
            if status in _ENDS_TASK:
                counted = self.completions.labels(kind, status)
            elif status == "retry_wait":
                counted = self.retries.labels(kind, "failure")
            else:
                counted = None
            children = (counted, self.run_time.labels(kind, status))
            self._end_children[key] = children
        if children[0] is not None:
            children[0].inc()
        if run_s is not None:
            children[1].observe(run_s if run_s > 0.0 else 0.0)

    def lease_expired(self, kind: str, outcome: str) -> None:
        """The reaper moved an expired lease's row to ``outcome`` (retry_wait or failed)."""
        self.lease_expiries.labels(kind, outcome).inc()
        if outcome == "retry_wait":
            self.retries.labels(kind, "lease_expired").inc()

    def outbox_outcomes(self, counts: dict[str, int]) -> None:
        """A deliverer pass's outcome counts (only the outcomes of deliveries are kept)."""
        for outcome in ("delivered", "failed", "dead_letter", "expired", "lost"):
            n = counts.get(outcome, 0)
            if n:
                self.outbox_deliveries.labels(outcome).inc(n)

    def http_admission(self, outcome: str) -> None:
        self.http_admissions.labels(outcome).inc()


__all__ = ["QUEUE_WAIT_BUCKETS_S", "RUN_BUCKETS_S", "TaskMetrics"]
