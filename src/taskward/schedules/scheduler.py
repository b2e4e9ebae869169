"""The scheduler: evaluates due schedules and admits their fires through ``submit_task``,
deciding each evaluation before admission with one compare-and-swap on the schedule row (the
package docstring, ``taskward.schedules``, tells the whole protocol)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import dataclass, field
from typing import Final

from taskward.adapters import build_registry
from taskward.admission import submit_task, validate_application
from taskward.cadence import (
    Cadence,
    floor_epoch,
    utc_iso,
)
from taskward.canonical import dumps
from taskward.errors import (
    TaskIdempotencyConflict,
    TaskValidationError,
)
from taskward.loops import raise_if_cancelling
from taskward.registry import TaskAdapterRegistry
from taskward.schedules.definitions import (
    ACTIVE_STATUSES_JSON,
    application_for,
    cadence_of,
    moment_of,
    normalized,
    schedule_fire_key,
)
from taskward.store.port import Row, StateDB
from taskward.store.retry import Streak, loop_backoff

log = logging.getLogger("taskward.schedules")

MISFIRE_COUNT_CAP: Final = 100_000
DEFAULT_BATCH: Final = 200
DEFAULT_INTERVAL_S: Final = 1.0
CAS_ATTEMPTS: Final = 3


# -- deciding fires ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FirePlan:
    """What one evaluation of a due schedule decides, before anything is admitted."""

    fires: tuple[int, ...]  # nominal times to admit, oldest first
    overlap_skipped: tuple[int, ...]
    misfire_skips: int
    last_skip_reason: str | None
    last_skip_at: int | None
    next_fire_at: int | None


def plan_fires(
    cadence: Cadence,
    *,
    cursor: int,
    now: int,
    misfire_policy: str,
    catch_up_max: int,
    misfire_grace_s: int,
    overlap_policy: str,
    has_active_run: bool,
) -> FirePlan:
    """Decide the nominal times in ``[cursor, now]`` (pure).

    A due time is *missed* when a later one is also due, or when it is older than
    ``misfire_grace_s``. ``skip`` fires only the latest due time, and only if it is not missed;
    ``fire_once`` fires the latest due time even when late; ``catch_up`` fires the latest
    ``catch_up_max`` due times, oldest first. The rest are misfire skips. Then ``overlap_policy``
    ``skip`` admits at most one fire, and none while a run of the schedule is not terminal.
    """
    if misfire_policy == "catch_up":
        keep_n = catch_up_max
    elif misfire_policy == "fire_once":
        keep_n = 1
    else:
        latest = cadence.latest_at_or_before(now)
        keep_n = 1 if latest is not None and now - latest <= misfire_grace_s else 0
    kept: list[int] = []
    first_missed: int | None = None
    for nominal in cadence.iter_at_or_before(now):
        if nominal < cursor:
            break
        if len(kept) == keep_n:
            first_missed = nominal
            break
        kept.append(nominal)
    kept.reverse()
    due = max(cadence.count_between(cursor, now, cap=MISFIRE_COUNT_CAP), len(kept))
    misfire_skips = due - len(kept)
    fires: tuple[int, ...] = tuple(kept)
    overlap_skipped: tuple[int, ...] = ()
    if overlap_policy == "skip" and fires:
        # Each fire after the first would overlap the one before it, still queued.
        cut = 0 if has_active_run else 1
        fires, overlap_skipped = fires[:cut], fires[cut:]
    reason: str | None = None
    skip_at: int | None = None
    if overlap_skipped:
        reason, skip_at = "overlap", overlap_skipped[-1]
    elif misfire_skips:
        reason, skip_at = "misfire", first_missed
    return FirePlan(
        fires=fires,
        overlap_skipped=overlap_skipped,
        misfire_skips=misfire_skips,
        last_skip_reason=reason,
        last_skip_at=skip_at,
        next_fire_at=cadence.next_after(now),
    )


@dataclass
class SchedulerMetrics:
    """What this scheduler did since it started (the per-schedule totals are on the rows)."""

    passes: int = 0
    fires: int = 0
    overlap_skips: int = 0
    misfire_skips: int = 0
    lost_races: int = 0
    errors: int = 0


@dataclass
class PassReport:
    """One ``run_once``: schedules evaluated, task ids admitted, skips decided, races lost."""

    evaluated: int = 0
    task_ids: list[str] = field(default_factory=list)
    overlap_skips: int = 0
    misfire_skips: int = 0
    lost_races: int = 0


class SchedulerState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class Scheduler:
    """Evaluates due schedules and admits their fires through ``submit_task``.

    ``run_once(now=...)`` is one pass (tests call it); ``run()`` loops every ``interval_s``
    until ``stop()``, which is safe twice and before ``run()``. A stopped scheduler is not
    reused.
    """

    def __init__(
        self,
        db: StateDB,
        registry: TaskAdapterRegistry | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        self.db = db
        self.registry = registry if registry is not None else build_registry()
        self.interval_s = interval_s
        self.batch = batch
        self.metrics = SchedulerMetrics()
        self.state = SchedulerState.NEW
        self._stop = asyncio.Event()

    async def run_once(self, now: float | None = None) -> PassReport:
        """Evaluate every schedule due at ``now`` (default: the store's clock, R9)."""
        moment = await moment_of(self.db, now)
        current = floor_epoch(moment)
        report = PassReport()
        rows = await self.db.fetchall(
            "schedule_due",
            {"now": current, "kinds": dumps(self.registry.kinds()), "limit": self.batch},
        )
        for row in rows:
            report.evaluated += 1
            await self._evaluate(normalized(row, reveal_env=True), moment, current, report)
        self.metrics.passes += 1
        return report

    async def _evaluate(self, row: Row, moment: float, current: int, report: PassReport) -> None:
        for _ in range(CAS_ATTEMPTS):
            if row["pending_fires"]:
                await self._admit(row, row["pending_fires"], row["revision"], moment, report)
            else:
                if not (
                    row["enabled"]
                    and row["removed_at"] is None
                    and row["next_fire_at"] is not None
                    and row["next_fire_at"] <= current
                ):
                    return
                if await self._decide(row, moment, current, report):
                    return
                report.lost_races += 1
                self.metrics.lost_races += 1
            fresh = await self.db.fetchone("schedule_get", {"id": row["id"]})
            if fresh is None:  # pragma: no cover - schedules are never deleted (R11)
                return
            row = normalized(fresh, reveal_env=True)

    async def _decide(self, row: Row, moment: float, current: int, report: PassReport) -> bool:
        """Decide the due fires with one compare-and-swap; False when it lost the race."""
        schedule_id = row["id"]
        try:
            cadence = cadence_of(row)
            # Admission would refuse it: decide nothing, say why, leave it due.
            validate_application(
                application_for(row, schedule_fire_key(schedule_id, row["next_fire_at"])),
                self.registry,
            )
        except TaskValidationError as exc:
            await self._record_error(row, f"not evaluated: {exc}", moment)
            return True
        has_active_run = row["overlap_policy"] == "skip" and (
            await self.db.fetchone(
                "schedule_has_active_run",
                {"schedule_id": schedule_id, "statuses": ACTIVE_STATUSES_JSON},
            )
            is not None
        )
        plan = plan_fires(
            cadence,
            cursor=row["next_fire_at"],
            now=current,
            misfire_policy=row["misfire_policy"],
            catch_up_max=row["catch_up_max"],
            misfire_grace_s=row["misfire_grace_s"],
            overlap_policy=row["overlap_policy"],
            has_active_run=has_active_run,
        )
        decided = await self.db.fetchone(
            "schedule_decide_if_revision",
            {
                "id": schedule_id,
                "revision": row["revision"],
                "next_fire_at": plan.next_fire_at,
                "pending_fires": dumps(list(plan.fires)),
                "fires": len(plan.fires),
                "overlap_skips": len(plan.overlap_skipped),
                "misfire_skips": plan.misfire_skips,
                "last_skip_reason": plan.last_skip_reason,
                "last_skip_at": plan.last_skip_at,
                "now": moment,
            },
        )
        if decided is None:
            return False
        report.overlap_skips += len(plan.overlap_skipped)
        report.misfire_skips += plan.misfire_skips
        self.metrics.overlap_skips += len(plan.overlap_skipped)
        self.metrics.misfire_skips += plan.misfire_skips
        if plan.overlap_skipped or plan.misfire_skips:
            log.info(
                "schedule %s: skipped %d overlapping and %d missed fire(s)",
                schedule_id,
                len(plan.overlap_skipped),
                plan.misfire_skips,
            )
        if plan.fires:
            await self._admit(row, list(plan.fires), decided["revision"], moment, report)
        return True

    async def _admit(
        self, row: Row, fires: list[int], revision: int, moment: float, report: PassReport
    ) -> None:
        """Admit decided fires (a replay when another scheduler already did), then clear them."""
        last_run_id: str | None = None
        last_fire_at: int | None = None
        error: str | None = None
        for nominal in sorted(fires):
            try:
                task_id = await submit_task(
                    self.db,
                    application_for(row, schedule_fire_key(row["id"], nominal)),
                    registry=self.registry,
                    admission_source="schedule",
                    schedule_id=row["id"],
                    now=moment,
                )
            except (TaskValidationError, TaskIdempotencyConflict) as exc:
                # Permanent for this fire (a retry gets the same answer): drop it, say why.
                error = f"fire at {utc_iso(nominal)} ({nominal}) not admitted: {exc}"
                self.metrics.errors += 1
                log.warning("schedule %s: %s", row["id"], error)
                continue
            last_run_id, last_fire_at = task_id, nominal
            report.task_ids.append(task_id)
            self.metrics.fires += 1
        await self.db.fetchone(
            "schedule_admitted_if_revision",
            {
                "id": row["id"],
                "revision": revision,
                "last_fire_at": last_fire_at,
                "last_run_id": last_run_id,
                "last_error": error,
                "now": moment,
            },
        )

    async def _record_error(self, row: Row, error: str, moment: float) -> None:
        changed = await self.db.fetchone(
            "schedule_record_error", {"id": row["id"], "error": error, "now": moment}
        )
        if changed is not None:
            self.metrics.errors += 1
            log.warning("schedule %s: %s", row["id"], error)

    async def run(self) -> None:
        """Evaluate due schedules every ``interval_s`` until ``stop()``."""
        if self.state is not SchedulerState.NEW:
            raise RuntimeError(f"this scheduler is {self.state.value}; create a new one")
        self.state = SchedulerState.RUNNING
        streak = Streak(loop_backoff(self.interval_s), what="scheduler pass", logger=log)
        try:
            while not self._stop.is_set():
                raise_if_cancelling()
                wait_s = self.interval_s
                try:
                    await self.run_once()
                except Exception as exc:  # the store may be away: back off, try again
                    self.metrics.errors += 1
                    wait_s = streak.failed(exc)
                else:
                    streak.succeeded()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait_s)
        finally:
            self.state = SchedulerState.STOPPED

    def stop(self) -> None:
        """Ask ``run()`` to return after its current pass; safe twice and before ``run()``."""
        self._stop.set()
        if self.state is SchedulerState.NEW:
            self.state = SchedulerState.STOPPED
