"""This process's metrics: what its admissions, claims, acknowledgements, lease reaper and
outbox deliverer did, collected by ``prometheus-client`` from a ``CollectorRegistry`` of its own
(never the global default one: a test process runs many).

A ``TaskMetrics`` is recorded through the store its process opened (``StateDB.metrics``, set by
whoever owns it: ``WorkerRuntime``, ``create_app``), the way the store carries its wake-up
signals: each event is recorded at one place -- ``admission`` (admissions),
``host.source`` (claims with their queue wait; acknowledged ends with their run time and the
retries they schedule), ``maintenance.leases`` (lease expiries and their retries),
``outbox.deliverer`` (deliveries) -- after its transaction committed, so a group commit that
rolls back and runs again alone counts once.

The cost of a task is kept tiny (bench/instructions.py counts it): a recording adds to plain
numbers -- a dict entry per label values, a bucket found by ``bisect`` -- and ``collect()``, at a
scrape, turns them into prometheus-client's metric families (``CounterMetricFamily``,
``HistogramMetricFamily``), so no text is formatted here. prometheus-client's own ``Counter``
and ``Histogram`` cost four times as much a task (locks, checks and a linear bucket scan a
call: +2.6 % instructions a task on the SQLite drain against +0.98 % for these). Known limit:
recordings come from one thread, the event loop's (every recording site runs on it); a scrape
from another thread (``exposition.MetricsServer``) copies each series in one C-level step, so
it never sees a half-written value, though a histogram's ``_sum`` may miss an observation its
buckets already count.

Imports nothing of taskward, no web stack, and prometheus-client only at the first scrape (a
worker without ``--metrics-port``, every CLI command, never loads it); exposition is
``prometheus_client``'s own
(``taskward.exposition``: the service's ``/metrics`` and a worker's ``--metrics-port``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Final, cast

if TYPE_CHECKING:  # imported at the first scrape: a process that serves none never loads it
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.registry import Collector, CollectorRegistry

# Queue wait (queued -> running): from milliseconds on an idle worker to an hour of backlog.
QUEUE_WAIT_BUCKETS_S: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
# Run time (running -> an acknowledged end): the old execution histogram's buckets.
RUN_BUCKETS_S: Final[tuple[float, ...]] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
)  # fmt: skip
# The statuses an acknowledged end may leave a row in that end the task; `retry_wait` ends an
# attempt only (a retry scheduled).
_ENDS_TASK: Final = frozenset({"completed", "failed", "timed_out", "cancelled"})
OUTBOX_OUTCOMES: Final = ("delivered", "failed", "dead_letter", "expired", "lost")

Labels = tuple[str, ...]


class _Counter:
    """A labelled counter's values, by label values."""

    __slots__ = ("documentation", "labelnames", "name", "values")

    def __init__(self, name: str, documentation: str, labelnames: Labels) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def family(self) -> CounterMetricFamily:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in list(self.values.items()):
            family.add_metric(labels, value)
        return family


class _Series:
    """One histogram series: a count per bucket (the last one +Inf), not cumulative, and the
    sum of what was observed."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.total = 0.0


class _Histogram:
    """A labelled histogram's series, by label values."""

    __slots__ = ("bounds", "documentation", "labelnames", "les", "name", "series")

    def __init__(
        self, name: str, documentation: str, labelnames: Labels, bounds: tuple[float, ...]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = bounds
        self.les = [*(repr(float(b)) for b in bounds), "+Inf"]  # "0.005", "1.0", ...
        self.series: dict[Labels, _Series] = {}

    def child(self, labels: Labels) -> _Series:
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Series(len(self.bounds))
        return series

    def observe(self, labels: Labels, value: float) -> None:
        """One observation: the bucket of the first bound >= ``value`` (``le`` is inclusive,
        found by bisection), else +Inf; a value <= 0 (the same instant, or a clock step back)
        counts as 0."""
        series = self.series.get(labels) or self.child(labels)
        if value > 0.0:
            series.counts[bisect_left(self.bounds, value)] += 1
            series.total += value
        else:
            series.counts[0] += 1

    def family(self) -> HistogramMetricFamily:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in list(self.series.items()):
            counts, running = list(series.counts), 0
            buckets = []
            for le, n in zip(self.les, counts, strict=True):
                running += n
                buckets.append((le, float(running)))
            family.add_metric(labels, buckets, sum_value=series.total)
        return family


class TaskMetrics:
    """One process's counters and histograms (see the module docstring); ``registry`` is what
    an exposition collects (it holds this collector alone, and is made at first use)."""

    def __init__(self) -> None:
        self.admissions = _Counter(
            "taskward_task_admissions",
            "Admissions by this process, by kind and outcome (new: a row inserted; existing: "
            "a replayed key answered with its task).",
            ("kind", "outcome"),
        )
        self.claims = _Counter(
            "taskward_task_claims", "Tasks claimed by this process's workers.", ("kind",)
        )
        self.completions = _Counter(
            "taskward_task_completions",
            "Tasks this process's workers ended, by kind and terminal status.",
            ("kind", "status"),
        )
        self.queue_wait = _Histogram(
            "taskward_task_queue_wait_seconds",
            "Time from queued (or due, for a delayed task) to its claim, by kind.",
            ("kind",),
            QUEUE_WAIT_BUCKETS_S,
        )
        self.run_time = _Histogram(
            "taskward_task_run_seconds",
            "Time from claim to the acknowledged end of an attempt, by kind and the status it "
            "left the task in (retry_wait included).",
            ("kind", "status"),
            RUN_BUCKETS_S,
        )
        self.lease_expiries = _Counter(
            "taskward_task_lease_expiries",
            "Expired leases this process's reaper recovered, by kind and outcome "
            "(retry_wait or failed).",
            ("kind", "outcome"),
        )
        self.retries = _Counter(
            "taskward_task_retries_scheduled",
            "Attempts sent to retry_wait by this process, by kind and cause (failure: a "
            "retryable failure acknowledged; lease_expired: the reaper).",
            ("kind", "cause"),
        )
        self.outbox_deliveries = _Counter(
            "taskward_outbox_deliveries",
            "Outbox delivery outcomes of this process's deliverer (delivered, failed, "
            "dead_letter, expired, lost).",
            ("outcome",),
        )
        self.http_admissions = _Counter(
            "taskward_http_admissions",
            "POST /api/tasks answers of this process, by outcome (rejected ones included).",
            ("outcome",),
        )
        self._families: tuple[_Counter | _Histogram, ...] = (
            self.admissions,
            self.claims,
            self.completions,
            self.queue_wait,
            self.run_time,
            self.lease_expiries,
            self.retries,
            self.outbox_deliveries,
            self.http_admissions,
        )
        self._registry: CollectorRegistry | None = None

    @property
    def registry(self) -> CollectorRegistry:
        """A ``CollectorRegistry`` of this process's own holding this collector."""
        if self._registry is None:
            from prometheus_client.registry import CollectorRegistry

            registry = CollectorRegistry(auto_describe=False)
            registry.register(cast("Collector", self))  # a collector: it has collect()
            self._registry = registry
        return self._registry

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family.family()

    # -- recordings: one call per event, from the event loop's thread ----------------------

    def admitted(self, kind: str, *, created: bool) -> None:
        """An admission answered: a new row, or a replayed key's existing one."""
        self.admissions.inc((kind, "new" if created else "existing"))

    def claimed(self, kind: str, wait_s: float) -> None:
        """A claim committed, ``wait_s`` after its row was queued (or due)."""
        key = (kind,)
        self.claims.inc(key)
        self.queue_wait.observe(key, wait_s)

    def ended(self, kind: str, status: str, run_s: float | None) -> None:
        """An attempt's acknowledgement committed, leaving the row in ``status``; ``run_s``
        None: its claim is not this process's (no run time observed)."""
        key = (kind, status)
        if status in _ENDS_TASK:
            self.completions.inc(key)
        elif status == "retry_wait":
            self.retries.inc((kind, "failure"))
        if run_s is not None:
            self.run_time.observe(key, run_s)

    def lease_expired(self, kind: str, outcome: str) -> None:
        """The reaper moved an expired lease's row to ``outcome`` (retry_wait or failed)."""
        self.lease_expiries.inc((kind, outcome))
        if outcome == "retry_wait":
            self.retries.inc((kind, "lease_expired"))

    def outbox_outcomes(self, counts: Mapping[str, int]) -> None:
        """A deliverer pass's outcome counts (only the outcomes of deliveries are kept)."""
        for outcome in OUTBOX_OUTCOMES:
            n = counts.get(outcome, 0)
            if n:
                self.outbox_deliveries.inc((outcome,), n)

    def http_admission(self, outcome: str) -> None:
        """A POST /api/tasks answer (created, existing, conflict, rejected)."""
        self.http_admissions.inc((outcome,))


__all__ = ["OUTBOX_OUTCOMES", "QUEUE_WAIT_BUCKETS_S", "RUN_BUCKETS_S", "TaskMetrics"]
