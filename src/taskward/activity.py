"""What the dashboard reads beyond one task: the task list's search with both page directions
and a bounded total, and the overview's activity over time, computed from the transition facts.

Activity (``read_activity``): over one of ``RANGES`` (a bounded number of time buckets, aligned
to whole bucket widths), per kind and bucket, the tasks that ended by status and the p95 of
their run time; and the queue depth of each waiting or running state at the end of each bucket.

- Endings come from the terminal facts (``dash_fact_endings``), grouped on the store's side by
  bucket, kind, status and run-time class (``DURATION_BOUNDS``), so the answer is bounded by
  buckets x kinds x statuses x classes whatever the traffic. The p95 is the upper bound of the
  class holding the 95th percentile: an estimate within one class, as a Prometheus histogram's.
- Depth is reconstructed, not sampled: from the counts of now, each bucket's facts are undone
  backwards (a fact into a state was one more there after it, a fact out of one was one more
  before it; an admission is one more queued). Exact while no row in a non-terminal state has
  been removed (archive only takes ended tasks), with no sampler to run.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from taskward.canonical import canonical_json
from taskward.cursors import decode_cursor, encode_cursor
from taskward.errors import TaskValidationError
from taskward.lifecycle import Status
from taskward.reads import ARGS_PREVIEW_CHARS, ELLIPSIS
from taskward.store.port import Row, StateDB

# name -> (bucket width in seconds, buckets): at most 96 buckets however long the range.
RANGES: Final[dict[str, tuple[int, int]]] = {
    "1h": (60, 60),
    "6h": (300, 72),
    "24h": (900, 96),
    "7d": (7200, 84),
}
DEFAULT_RANGE: Final = "1h"
# Run-time classes of dash_fact_endings (upper bounds, seconds); past the last: "longer".
DURATION_BOUNDS: Final = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    math.inf,
)
# The states whose depth is charted (an ended state only grows: it is no queue).
DEPTH_STATES: Final = ("queued", "waiting_dependency", "running", "retry_wait")
# The list's total is counted up to this many (then shown as "10000+").
COUNT_CAP: Final = 10_000
MAX_QUERY_CHARS: Final = 200
MAX_PAGE: Final = 200


@dataclass
class KindSeries:
    """One kind's endings per bucket: ``ended[status][i]``, and the p95 run time of bucket
    ``i`` (None where no ended task of it ran)."""

    kind: str
    ended: dict[str, list[int]]
    p95_s: list[float | None]

    @property
    def total(self) -> int:
        return sum(sum(v) for v in self.ended.values())


@dataclass
class Activity:
    range: str
    since: float
    bucket_s: int
    buckets: int
    kinds: list[KindSeries] = field(default_factory=list)
    # state -> depth at the end of each bucket
    depth: dict[str, list[int]] = field(default_factory=dict)

    def edges(self) -> list[float]:
        """The start of each bucket (epoch seconds)."""
        return [self.since + i * self.bucket_s for i in range(self.buckets)]


def window(range_name: str, now: float) -> tuple[float, int, int]:
    """``(since, bucket_s, buckets)`` of a range ending with the bucket that holds ``now``."""
    if range_name not in RANGES:
        raise TaskValidationError("range", range_name, sorted(RANGES))
    bucket_s, buckets = RANGES[range_name]
    current = math.floor(now / bucket_s) * bucket_s
    return float(current - (buckets - 1) * bucket_s), bucket_s, buckets


def p95_of(histogram: Sequence[int]) -> float | None:
    """The upper bound of the class holding the 95th percentile of ``histogram`` (counts per
    ``DURATION_BOUNDS`` class), or None when it is empty. The open last class answers the
    bound below it (a lower bound: "over an hour")."""
    total = sum(histogram)
    if total == 0:
        return None
    rank = math.ceil(0.95 * total)
    seen = 0
    for i, n in enumerate(histogram):
        seen += n
        if seen >= rank:
            bound = DURATION_BOUNDS[i]
            return bound if math.isfinite(bound) else DURATION_BOUNDS[i - 1]
    return None  # pragma: no cover - rank <= total


def endings_by_kind(rows: Sequence[Mapping[str, Any]], buckets: int) -> list[KindSeries]:
    """``dash_fact_endings`` rows -> one series per kind, the busiest first."""
    counts: dict[str, dict[str, list[int]]] = {}
    hist: dict[str, list[list[int]]] = {}
    for row in rows:
        i = int(row["bucket"])
        if not 0 <= i < buckets:
            continue
        kind, status, n = str(row["action_kind"]), str(row["status"]), int(row["n"])
        per = counts.setdefault(kind, {})
        per.setdefault(status, [0] * buckets)[i] += n
        if row.get("duration_class") is not None:
            h = hist.setdefault(kind, [[0] * len(DURATION_BOUNDS) for _ in range(buckets)])
            h[i][int(row["duration_class"])] += n
    out = []
    for kind, ended in counts.items():
        classes = hist.get(kind)
        p95 = [p95_of(classes[i]) if classes else None for i in range(buckets)]
        out.append(KindSeries(kind, ended, p95))
    out.sort(key=lambda s: (-s.total, s.kind))
    return out


def depth_by_state(
    now_counts: Mapping[str, int],
    flows: Sequence[Mapping[str, Any]],
    admitted: Sequence[Mapping[str, Any]],
    buckets: int,
) -> dict[str, list[int]]:
    """Each charted state's depth at the end of each bucket, undone backwards from the counts
    of now (``now_counts``) through the facts (``flows``: bucket, previous_status, status, n)
    and the admissions (``admitted``: bucket, n) of each bucket. Facts past the last bucket
    (none, unless the clock moved between the reads) count in the last."""
    net = {s: [0] * buckets for s in DEPTH_STATES}
    for row in flows:
        i = min(max(int(row["bucket"]), 0), buckets - 1)
        n = int(row["n"])
        if row["status"] in net:
            net[row["status"]][i] += n
        if row.get("previous_status") in net:
            net[row["previous_status"]][i] -= n
    for row in admitted:
        i = min(max(int(row["bucket"]), 0), buckets - 1)
        net["queued"][i] += int(row["n"])
    depth: dict[str, list[int]] = {}
    for state in DEPTH_STATES:
        level = int(now_counts.get(state, 0))
        series = [0] * buckets
        for i in range(buckets - 1, -1, -1):
            series[i] = max(level, 0)  # the level at the end of bucket i
            level -= net[state][i]
        depth[state] = series
    return depth


async def read_activity(db: StateDB, *, range_name: str = DEFAULT_RANGE) -> Activity:
    """The overview's charts over ``range_name`` (one of ``RANGES``): three aggregate reads
    and the counts of now."""
    now = await db.now()
    since, bucket_s, buckets = window(range_name, now)
    span = {"since": since, "bucket_s": bucket_s}
    endings = await db.fetchall("dash_fact_endings", {**span, "until": since + buckets * bucket_s})
    counts = {r["status"]: int(r["n"]) for r in await db.fetchall("run_count_by_status")}
    flows = await db.fetchall("dash_fact_flows", span)
    admitted = await db.fetchall("dash_admissions", span)
    return Activity(
        range=range_name,
        since=since,
        bucket_s=bucket_s,
        buckets=buckets,
        kinds=endings_by_kind(endings, buckets),
        depth=depth_by_state(counts, flows, admitted, buckets),
    )


# -- the task list ---------------------------------------------------------------------------


@dataclass
class TaskPage:
    """One page of the list: ``rows`` newest first; ``next_cursor`` (older rows) and
    ``newer_cursor`` (the previous page) when there are more that way; ``total`` counted up to
    ``COUNT_CAP`` (``capped`` when it reached it)."""

    rows: list[Row]
    next_cursor: str | None
    newer_cursor: str | None
    total: int
    capped: bool


def search_text(q: str | None) -> str | None:
    """The search box's text, trimmed and lower-cased; None for an empty one."""
    if q is None:
        return None
    q = q.strip()
    if not q:
        return None
    if len(q) > MAX_QUERY_CHARS or "\x00" in q:
        raise TaskValidationError("q", q[:40], f"at most {MAX_QUERY_CHARS} characters, no NUL")
    return q.lower()


def _preview(row: Row) -> Row:
    """The args' head as the list shows it: whole args in canonical JSON (one spelling on both
    dialects), a cut head as the store wrote it, with an ellipsis."""
    head = row.pop("args_head", None) or ""
    if len(head) <= ARGS_PREVIEW_CHARS:
        with contextlib.suppress(ValueError):
            head = canonical_json(json.loads(head))
    row["args_preview"] = (
        head if len(head) <= ARGS_PREVIEW_CHARS else head[:ARGS_PREVIEW_CHARS] + ELLIPSIS
    )
    return row


async def search_tasks(
    db: StateDB,
    *,
    status: str | None = None,
    action_kind: str | None = None,
    execution_target: str | None = None,
    q: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    newer: str | None = None,
    with_total: bool = True,
) -> TaskPage:
    """A page of tasks newest first, filtered and searched (``q``: a substring of the id, key,
    kind, args without ``env``, error or reason; case-insensitive). ``cursor`` pages to older
    rows, ``newer`` (a page's ``newer_cursor``) back to newer ones; not both. Without
    ``with_total`` the page's ``total`` is the rows shown (no count is read)."""
    if status is not None and status not in {s.value for s in Status}:
        raise TaskValidationError("status", status, [s.value for s in Status])
    if not 1 <= limit <= MAX_PAGE:
        raise TaskValidationError("limit", limit, f"1..{MAX_PAGE}")
    if cursor and newer:
        raise TaskValidationError("newer", newer[:40], "no cursor beside it")
    filters: dict[str, Any] = {
        "status": status,
        "action_kind": action_kind,
        "execution_target": execution_target,
        "q": search_text(q),
    }
    params = {**filters, "limit": limit + 1, "args_head_chars": ARGS_PREVIEW_CHARS + 1}
    if newer:
        at, ident = decode_cursor(newer)
        rows = await db.fetchall(
            "dash_task_list_newer", {**params, "newer_created_at": at, "newer_id": ident}
        )
        more_newer = len(rows) > limit
        rows = rows[:limit][::-1]
        older = bool(rows)
    else:
        at_id = decode_cursor(cursor) if cursor else (None, None)
        rows = await db.fetchall(
            "dash_task_list",
            {**params, "cursor_created_at": at_id[0], "cursor_id": at_id[1]},
        )
        older = len(rows) > limit
        rows = rows[:limit]
        more_newer = cursor is not None and bool(rows)
    total = len(rows)
    if with_total:
        counted = await db.fetchone("dash_task_count", {**filters, "cap": COUNT_CAP})
        total = int(counted["n"]) if counted else 0
    return TaskPage(
        rows=[_preview(r) for r in rows],
        next_cursor=encode_cursor(rows[-1]) if older and rows else None,
        newer_cursor=encode_cursor(rows[0]) if more_newer and rows else None,
        total=total,
        capped=total >= COUNT_CAP,
    )
