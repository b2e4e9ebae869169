"""``/metrics`` in the Prometheus text format (version 0.0.4).

Computed from the store on every scrape (so every process and machine agrees):
  - ``taskward_tasks{status,execution_target}`` and ``taskward_queue_depth{status}`` (gauges);
  - ``taskward_admissions_total{source}``: runs are never deleted (R11), so a count of rows is a
    counter;
  - ``taskward_transitions_total{from,to,reason}`` and ``taskward_lease_expiries_total``: facts
    are append-only (ADR-0072 D3), so counts of facts are counters;
  - ``taskward_worker_*``: heartbeat time and age per worker, and the number of live workers;
  - ``taskward_schedules``, ``taskward_schedule_fires_total``, ``taskward_schedule_skips_total``
    (counters kept on the schedule rows, which are never deleted, R11) and
    ``taskward_outbox_notifications{status}`` (a gauge: purge deletes finished rows).
Kept in this process (reset when it restarts):
  - ``taskward_execution_duration_seconds{outcome}``: a histogram of the tasks run by the workers
    inside this process (``taskward up``); a separate ``taskward worker`` process exposes none;
  - ``taskward_http_admissions_total{outcome}``: POST /api/tasks answers of this process,
    including rejected ones, which the store never sees.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from taskward.host.models import Task
from taskward.lifecycle import Status
from taskward.outbox import count_notifications
from taskward.reads import (
    count_admissions_by_source,
    count_by_status_and_target,
    count_transitions_by_edge,
    list_workers,
)
from taskward.schedules import schedule_metrics
from taskward.store import StateDB

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS_S: Final[tuple[float, ...]] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
)  # fmt: skip
LEASE_EXPIRY_REASONS: Final = frozenset({"lease_expired", "attempts_exhausted"})

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{name}="{_escape(str(value))}"' for name, value in labels)
    return "{" + text + "}" if text else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, labels: Iterable[tuple[str, str]] = ()) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Counter:
    """A labelled in-process counter."""

    def __init__(self) -> None:
        self._values: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def inc(self, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def items(self) -> list[tuple[Labels, float]]:
        with self._lock:
            return sorted(self._values.items())


class Histogram:
    """A labelled in-process histogram with fixed buckets (cumulative on output)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = tuple(sorted(buckets))
        self._series: dict[Labels, tuple[list[int], float, int]] = {}
        self._lock = threading.Lock()

    def observe(self, labels: Mapping[str, str], value: float) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            counts, total, n = self._series.get(key, ([0] * len(self.buckets), 0.0, 0))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            self._series[key] = (counts, total + value, n + 1)

    def items(self) -> list[tuple[Labels, list[int], float, int]]:
        with self._lock:
            return [(k, list(c), s, n) for k, (c, s, n) in sorted(self._series.items())]


class Metrics:
    """The in-process half of /metrics; pass one to ``create_app`` and, in ``taskward up``, its
    ``worker_event`` to the WorkerRuntime as ``on_event``."""

    def __init__(self) -> None:
        self.http_admissions = Counter()
        self.execution_duration = Histogram(DURATION_BUCKETS_S)
        self._started: dict[str, float] = {}

    def record_admission(self, outcome: str) -> None:
        self.http_admissions.inc({"outcome": outcome})

    def observe_execution(self, outcome: str, seconds: float) -> None:
        self.execution_duration.observe({"outcome": outcome}, seconds)

    def worker_event(self, kind: str, task: Task, data: dict[str, Any]) -> None:
        """A ResidentEngineHost ``on_event`` hook: times each task from start to end."""
        key = f"{task.id}/{task.lease_id}"
        if kind == "start":
            self._started[key] = time.monotonic()
        elif kind == "end":
            began = self._started.pop(key, None)
            if began is not None:
                self.observe_execution(
                    str(data.get("outcome", "unknown")), time.monotonic() - began
                )


async def render_metrics(
    db: StateDB, metrics: Metrics, *, heartbeat_ttl_s: float, now: float | None = None
) -> str:
    """The whole exposition: store-derived families first, then this process's own."""
    out = _Writer()
    if now is None:
        now = await db.now()

    pairs = await count_by_status_and_target(db)
    out.family("taskward_tasks", "gauge", "Tasks by status and execution target.")
    for row in sorted(pairs, key=lambda r: (r["status"], r["execution_target"] or "")):
        out.sample(
            "taskward_tasks",
            row["n"],
            (("status", row["status"]), ("execution_target", row["execution_target"] or "")),
        )
    depth = {s.value: 0 for s in Status}
    for row in pairs:
        depth[row["status"]] = depth.get(row["status"], 0) + row["n"]
    out.family("taskward_queue_depth", "gauge", "Tasks by status (all nine states).")
    for status, n in depth.items():
        out.sample("taskward_queue_depth", n, (("status", status),))

    admissions = await count_admissions_by_source(db)
    out.family("taskward_admissions_total", "counter", "Tasks ever admitted, by source.")
    for source in sorted(admissions):
        out.sample("taskward_admissions_total", admissions[source], (("source", source),))

    edges = await count_transitions_by_edge(db)
    out.family("taskward_transitions_total", "counter", "Status transitions ever applied, by edge.")
    expiries = 0
    for row in sorted(
        edges, key=lambda r: (r["previous_status"] or "", r["status"], r["reason_code"])
    ):
        out.sample(
            "taskward_transitions_total",
            row["n"],
            (
                ("from", row["previous_status"] or ""),
                ("to", row["status"]),
                ("reason", row["reason_code"]),
            ),
        )
        if row["reason_code"] in LEASE_EXPIRY_REASONS:
            expiries += row["n"]
    out.family(
        "taskward_lease_expiries_total",
        "counter",
        "Leases the reaper found expired (lease_expired and attempts_exhausted transitions).",
    )
    out.sample("taskward_lease_expiries_total", expiries)

    workers = await list_workers(db, heartbeat_ttl=heartbeat_ttl_s, now=now, limit=500)
    out.family("taskward_workers_live", "gauge", "Workers whose heartbeat is fresh.")
    out.sample("taskward_workers_live", sum(1 for w in workers if w["is_live"]))
    out.family(
        "taskward_worker_last_heartbeat_timestamp_seconds",
        "gauge",
        "Time of each worker's last heartbeat (epoch seconds).",
    )
    for w in workers:
        out.sample(
            "taskward_worker_last_heartbeat_timestamp_seconds",
            float(w["last_heartbeat_at"]),
            (("worker_id", w["worker_id"]),),
        )
    out.family(
        "taskward_worker_heartbeat_age_seconds", "gauge", "Seconds since each worker's heartbeat."
    )
    for w in workers:
        out.sample(
            "taskward_worker_heartbeat_age_seconds",
            w["heartbeat_age_s"],
            (("worker_id", w["worker_id"]),),
        )

    schedules = await schedule_metrics(db)
    out.family(
        "taskward_schedules", "gauge", "Schedule rows (removed ones stay, R11); enabled ones."
    )
    out.sample("taskward_schedules", schedules["schedules"], (("state", "all"),))
    out.sample("taskward_schedules", schedules["enabled"], (("state", "enabled"),))
    out.family(
        "taskward_schedule_fires_total",
        "counter",
        "Scheduled fires admitted, summed over schedules.",
    )
    out.sample("taskward_schedule_fires_total", schedules["fires"])
    out.family(
        "taskward_schedule_skips_total",
        "counter",
        "Fires skipped before admission (no task row written, R13), by reason.",
    )
    out.sample(
        "taskward_schedule_skips_total", schedules["overlap_skips"], (("reason", "overlap"),)
    )
    out.sample(
        "taskward_schedule_skips_total", schedules["misfire_skips"], (("reason", "misfire"),)
    )

    outbox = await count_notifications(db)
    out.family("taskward_outbox_notifications", "gauge", "Outbox notifications by status (R12).")
    for status, n in outbox.items():
        out.sample("taskward_outbox_notifications", n, (("status", status),))

    out.family(
        "taskward_execution_duration_seconds",
        "histogram",
        "Task execution time, start to acknowledgement, by the workers in this process.",
    )
    for labels, counts, total, n in metrics.execution_duration.items():
        for bound, count in zip(metrics.execution_duration.buckets, counts, strict=True):
            out.sample(
                "taskward_execution_duration_seconds_bucket",
                count,
                (*labels, ("le", _number(bound))),
            )
        out.sample("taskward_execution_duration_seconds_bucket", n, (*labels, ("le", "+Inf")))
        out.sample("taskward_execution_duration_seconds_sum", total, labels)
        out.sample("taskward_execution_duration_seconds_count", n, labels)

    out.family(
        "taskward_http_admissions_total",
        "counter",
        "POST /api/tasks answers of this process, by outcome.",
    )
    for labels, value in metrics.http_admissions.items():
        out.sample("taskward_http_admissions_total", value, labels)
    return out.text()
