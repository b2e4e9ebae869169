"""``/metrics`` by ``prometheus-client``: this process's ``TaskMetrics`` and the families read
from the store at each scrape, for the service (``http.system``) and for a worker's own
endpoint (``MetricsServer``, ``taskward worker --metrics-port``). Nothing here formats text:
``prometheus_client`` encodes (the text format, or OpenMetrics when the scraper asks for it).

The store-derived families are the same whichever process is scraped (every process and machine
reads one store):
  - ``taskward_tasks{status,execution_target}`` and ``taskward_queue_depth{status}`` (gauges);
  - ``taskward_admissions_total{source}``: runs are never deleted (R11), so a count of rows is a
    counter;
  - ``taskward_transitions_total{from,to,reason}`` and ``taskward_lease_expiries_total``: facts
    are append-only (ADR-0072 D3), so counts of facts are counters;
  - ``taskward_worker_*``: heartbeat time and age per worker, and the number of live workers;
  - ``taskward_schedules``, ``taskward_schedule_fires_total``, ``taskward_schedule_skips_total``
    and ``taskward_outbox_notifications{status}``.
A worker's endpoint reads only ``taskward_queue_depth`` (one grouped count a scrape); the
service reads them all. The process families (``taskward_task_*``, ``taskward_outbox_deliveries``,
``taskward_http_admissions``) are ``taskward.metrics``'s: see docs/operations.md "Metrics".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from taskward.lifecycle import Status
from taskward.metrics import TaskMetrics
from taskward.outbox import count_notifications
from taskward.reads import (
    count_admissions_by_source,
    count_by_status_and_target,
    count_transitions_by_edge,
    list_workers,
)
from taskward.schedules import schedule_metrics
from taskward.store.port import Row, StateDB

log = logging.getLogger("taskward.exposition")

LEASE_EXPIRY_REASONS: Final = frozenset({"lease_expired", "attempts_exhausted"})
# How long a worker's scrape waits for its store read on the worker's event loop.
STORE_READ_TIMEOUT_S: Final = 5.0


class Families(Collector):
    """Metric families read beforehand (the store's, at one scrape) and this process's
    registry, collected as one."""

    def __init__(self, families: Sequence[Metric], *metrics: TaskMetrics) -> None:
        self.families = families
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        yield from self.families
        seen = {family.name for family in self.families}
        for metrics in self.metrics:  # a family name once: the first registry's
            for family in metrics.registry.collect():
                if family.name not in seen:
                    seen.add(family.name)
                    yield family


def render(collector: Collector, accept: str | None = None) -> tuple[bytes, str]:
    """The exposition of ``collector`` and its content type, in the format the scraper's
    ``Accept`` header asks for (the Prometheus text format by default)."""
    encode, content_type = choose_encoder(accept or "")
    return encode(collector), content_type


async def queue_depth_family(db: StateDB) -> tuple[GaugeMetricFamily, list[Row]]:
    """``taskward_queue_depth{status}`` (all nine states) and the rows it was summed from."""
    pairs = await count_by_status_and_target(db)
    depth = {s.value: 0 for s in Status}
    for row in pairs:
        depth[row["status"]] = depth.get(row["status"], 0) + row["n"]
    family = GaugeMetricFamily(
        "taskward_queue_depth", "Tasks by status (all nine states).", labels=("status",)
    )
    for status, n in depth.items():
        family.add_metric((status,), n)
    return family, pairs


async def store_families(
    db: StateDB, *, heartbeat_ttl_s: float, now: float | None = None
) -> list[Metric]:
    """Every store-derived family (the module docstring), read now."""
    if now is None:
        now = await db.now()
    depth, pairs = await queue_depth_family(db)
    tasks = GaugeMetricFamily(
        "taskward_tasks",
        "Tasks by status and execution target.",
        labels=("status", "execution_target"),
    )
    for row in sorted(pairs, key=lambda r: (str(r["status"]), str(r["execution_target"] or ""))):
        tasks.add_metric((str(row["status"]), str(row["execution_target"] or "")), row["n"])

    admissions = CounterMetricFamily(
        "taskward_admissions", "Tasks ever admitted, by source.", labels=("source",)
    )
    for source, n in sorted((await count_admissions_by_source(db)).items()):
        admissions.add_metric((source,), n)

    transitions = CounterMetricFamily(
        "taskward_transitions",
        "Status transitions ever applied, by edge.",
        labels=("from", "to", "reason"),
    )
    expiries = 0
    edges = await count_transitions_by_edge(db)
    for row in sorted(
        edges, key=lambda r: (r["previous_status"] or "", r["status"], r["reason_code"])
    ):
        transitions.add_metric(
            (row["previous_status"] or "", row["status"], row["reason_code"]), row["n"]
        )
        if row["reason_code"] in LEASE_EXPIRY_REASONS:
            expiries += row["n"]
    lease_expiries = CounterMetricFamily(
        "taskward_lease_expiries",
        "Leases the reaper found expired (lease_expired and attempts_exhausted transitions).",
        value=expiries,
    )

    workers = await list_workers(db, heartbeat_ttl=heartbeat_ttl_s, now=now, limit=500)
    live = GaugeMetricFamily(
        "taskward_workers_live",
        "Workers whose heartbeat is fresh.",
        value=sum(1 for w in workers if w["is_live"]),
    )
    beat_at = GaugeMetricFamily(
        "taskward_worker_last_heartbeat_timestamp_seconds",
        "Time of each worker's last heartbeat (epoch seconds).",
        labels=("worker_id",),
    )
    beat_age = GaugeMetricFamily(
        "taskward_worker_heartbeat_age_seconds",
        "Seconds since each worker's heartbeat.",
        labels=("worker_id",),
    )
    for w in workers:
        beat_at.add_metric((w["worker_id"],), float(w["last_heartbeat_at"]))
        beat_age.add_metric((w["worker_id"],), w["heartbeat_age_s"])

    totals = await schedule_metrics(db)
    schedules = GaugeMetricFamily(
        "taskward_schedules",
        "Schedule rows (removed ones stay, R11); enabled ones.",
        labels=("state",),
    )
    schedules.add_metric(("all",), totals["schedules"])
    schedules.add_metric(("enabled",), totals["enabled"])
    fires = CounterMetricFamily(
        "taskward_schedule_fires",
        "Scheduled fires admitted, summed over schedules.",
        value=totals["fires"],
    )
    skips = CounterMetricFamily(
        "taskward_schedule_skips",
        "Fires skipped before admission (no task row written, R13), by reason.",
        labels=("reason",),
    )
    skips.add_metric(("overlap",), totals["overlap_skips"])
    skips.add_metric(("misfire",), totals["misfire_skips"])

    outbox = GaugeMetricFamily(
        "taskward_outbox_notifications", "Outbox notifications by status (R12).", labels=("status",)
    )
    for status, n in (await count_notifications(db)).items():
        outbox.add_metric((status,), n)
    return [
        tasks,
        depth,
        admissions,
        transitions,
        lease_expiries,
        live,
        beat_at,
        beat_age,
        schedules,
        fires,
        skips,
        outbox,
    ]


class _QueueDepth(Collector):
    """A worker endpoint's store read: run on the worker's event loop (where its store lives)
    from the server's thread; a scrape that cannot read it (the loop busy past the timeout,
    the store away) gets the process families alone, and the failure is logged."""

    def __init__(self, db: StateDB, loop: asyncio.AbstractEventLoop) -> None:
        self.db = db
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        future = asyncio.run_coroutine_threadsafe(queue_depth_family(self.db), self.loop)
        try:
            family, _ = future.result(timeout=STORE_READ_TIMEOUT_S)
        except Exception as exc:
            future.cancel()
            log.warning("metrics: queue depth not read: %r", exc)
            return
        yield family


class MetricsServer:
    """``taskward worker --metrics-port``: ``prometheus_client``'s own HTTP server on a daemon
    thread, serving this process's ``TaskMetrics`` and the store's queue depth at any path
    (``/metrics`` by convention). A thread, not the event loop: a scrape is answered while
    the loop runs tasks, and a busy loop delays only the queue depth read. ``stop()`` is safe
    twice and before ``start()``."""

    def __init__(
        self,
        metrics: TaskMetrics,
        *,
        port: int,
        host: str = "127.0.0.1",
        db: StateDB | None = None,
    ) -> None:
        self.metrics = metrics
        self.port = port
        self.host = host
        self.db = db
        self._shutdown: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen; call from the worker's event loop (the store's reads run there).

        Raises:
            OSError: the port is taken or the address cannot be bound.
        """
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Families((), self.metrics))
        if self.db is not None:
            registry.register(_QueueDepth(self.db, asyncio.get_running_loop()))
        server, thread = start_http_server(self.port, addr=self.host, registry=registry)
        self.port = server.server_port  # the bound one, when 0 asked for any
        self._shutdown = server.shutdown
        self._close = server.server_close
        self._thread = thread

    def stop(self) -> None:
        shutdown, self._shutdown = self._shutdown, None
        if shutdown is not None:
            shutdown()
            self._close()
            if self._thread is not None:
                self._thread.join(timeout=5)


__all__ = [
    "Families",
    "MetricsServer",
    "queue_depth_family",
    "render",
    "store_families",
]
