"""Schedules: their rows, manual fires, and the scheduler that admits due fires through
``submit_task`` (ADR-0072 D1, DESIGN.md R11, R13). No SQL here beyond named queries.

The scheduler never inserts a run and never writes ``running``: every fire is a ``submit_task``
call keyed ``schedule:<schedule-id>:<nominal-fire-epoch>``, so re-evaluating a cadence point
returns the task it already admitted. Each evaluation is decided *before* admission, with one
compare-and-swap on the schedule row (its ``revision``): the winner advances the cursor
(``next_fire_at``), counts the overlap and misfire skips (which write no task row, R13) and
records the fires it decided in ``pending_fires``; then it admits them and clears the list. If
it dies in between, any scheduler finds the pending fires and admits them (the keys make that a
replay, never a duplicate). Several schedulers therefore cooperate without a leader.

Known limits: the misfire count of one evaluation saturates at ``MISFIRE_COUNT_CAP`` nominal
times (a per-minute cron away for ten weeks); a scheduler evaluates only schedules whose kind
its own registry serves, so a schedule no running scheduler can admit stays due (``schedule
show`` tells by its past ``next_fire_at``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from taskward.adapters import build_registry
from taskward.admission import submit_task, validate_application
from taskward.cadence import (
    HORIZON_YEARS,
    Cadence,
    floor_epoch,
    make_cadence,
    utc_iso,
)
from taskward.canonical import dumps, loads
from taskward.errors import (
    ScheduleNotFound,
    TaskIdempotencyConflict,
    TaskValidationError,
)
from taskward.ids import new_id
from taskward.lifecycle import ACTIVE
from taskward.loops import raise_if_cancelling
from taskward.models import (
    DEFAULT_EXECUTION_TARGET,
    TaskApplication,
    check_key,
    check_text,
    shown_text,
)
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import Row, StateDB
from taskward.store.retry import Streak, loop_backoff

log = logging.getLogger("taskward.schedules")

MISFIRE_POLICIES: Final = ("skip", "fire_once", "catch_up")
OVERLAP_POLICIES: Final = ("allow", "skip")
DEFAULT_MISFIRE_POLICY: Final = "fire_once"
DEFAULT_OVERLAP_POLICY: Final = "allow"
DEFAULT_CATCH_UP_MAX: Final = 10
MAX_CATCH_UP: Final = 1000
DEFAULT_MISFIRE_GRACE_S: Final = 60
MAX_MISFIRE_GRACE_S: Final = 366 * 24 * 3600
MISFIRE_COUNT_CAP: Final = 100_000
MAX_NAME_LENGTH: Final = 200
MAX_LIST_LIMIT: Final = 1000
DEFAULT_BATCH: Final = 200
DEFAULT_INTERVAL_S: Final = 1.0
CAS_ATTEMPTS: Final = 3
# Statuses of a run that is not finished: the overlap policy "skip" waits for none of them.
_ACTIVE_STATUSES: Final = dumps(sorted(s.value for s in ACTIVE))
# Stands in for the per-fire key while a template is validated.
_TEMPLATE_KEY: Final = "schedule:template"


def schedule_fire_key(schedule_id: str, nominal_at: int) -> str:
    """The admission key of a scheduled fire (ADR-0072 D1): deterministic per cadence point."""
    return f"schedule:{schedule_id}:{nominal_at}"


def manual_fire_key(schedule_id: str) -> str:
    """A fresh key for a manual fire (R13): ``manual:<schedule-id>:<uuid4>``."""
    return f"manual:{schedule_id}:{uuid.uuid4()}"


def _normalize(row: Row) -> Row:
    """Rows read the same on both dialects: ``enabled`` a bool, ``pending_fires`` a list."""
    out = dict(row)
    out["enabled"] = bool(out["enabled"])
    pending = out.get("pending_fires")
    if isinstance(pending, str):
        out["pending_fires"] = loads(pending)
    return out


def cadence_of(row: Row) -> Cadence:
    return make_cadence(
        cron=row["cron_expression"],
        interval_s=row["interval_s"],
        timezone=row["timezone"],
        anchor_at=row["anchor_at"],
    )


def application_for(row: Row, key: str) -> TaskApplication:
    """The TaskApplication a schedule admits under ``key``."""
    return TaskApplication(
        action_kind=row["action_kind"],
        args=dict(row["action_args"]),
        execution_target=row["execution_target"],
        idempotency_key=key,
        required_capabilities=list(row["required_capabilities"] or []),
        library_ref=row["library_ref"],
        library_content_hash=row["library_content_hash"],
    )


def _check_int(field_name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TaskValidationError(field_name, value, f"an integer {low}..{high}")
    return value


def _check_choice(field_name: str, value: object, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise TaskValidationError(field_name, value, allowed)
    assert isinstance(value, str)
    return value


_NAME_ALLOWED: Final = (
    f"a non-empty string of at most {MAX_NAME_LENGTH} printable characters without "
    "surrounding whitespace"
)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH:
        shown = f"{len(name)} characters" if isinstance(name, str) else name
        raise TaskValidationError("name", shown, _NAME_ALLOWED)
    if not name.strip() or name != name.strip() or not name.isprintable():
        check_text("name", name)  # a NUL or a lone surrogate, named as such
        raise TaskValidationError("name", name, _NAME_ALLOWED)
    return name


def _check_texts(**fields: object) -> None:
    """The text rule of admission (``models.check_text``: valid UTF-8, no NUL) on each text
    field of a definition, before any of them is parsed, echoed in an error or stored (R14)."""
    for field_name, value in fields.items():
        if isinstance(value, str):
            check_text(field_name, value)


async def _now(db: StateDB, now: float | None) -> float:
    return now if now is not None else await db.now()


# -- the schedule rows ----------------------------------------------------------------------


async def create_schedule(
    db: StateDB,
    *,
    name: str,
    action_kind: str,
    args: dict[str, Any] | None = None,
    execution_target: str = DEFAULT_EXECUTION_TARGET,
    required_capabilities: Sequence[str] = (),
    library_ref: str | None = None,
    library_content_hash: str | None = None,
    cron: str | None = None,
    interval_s: int | None = None,
    timezone: str = "UTC",
    start_at: int | None = None,
    misfire_policy: str = DEFAULT_MISFIRE_POLICY,
    catch_up_max: int = DEFAULT_CATCH_UP_MAX,
    misfire_grace_s: int = DEFAULT_MISFIRE_GRACE_S,
    overlap_policy: str = DEFAULT_OVERLAP_POLICY,
    enabled: bool = True,
    registry: TaskAdapterRegistry | None = None,
    now: float | None = None,
) -> Row:
    """Create a schedule and return its row; its first fire is the first nominal time after
    ``now`` (for an interval, ``start_at`` if that is later: intervals count from it).

    Raises:
        TaskValidationError: a bad field, named (cron, timezone, interval_s, action_kind via the
            registry, args, ...); a name a live schedule already uses. Nothing is written.
    """
    _check_name(name)
    _check_texts(
        action_kind=action_kind,
        execution_target=execution_target,
        cron=cron,
        timezone=timezone,
        misfire_policy=misfire_policy,
        overlap_policy=overlap_policy,
    )
    _check_choice("misfire_policy", misfire_policy, MISFIRE_POLICIES)
    _check_int("catch_up_max", catch_up_max, 1, MAX_CATCH_UP)
    _check_int("misfire_grace_s", misfire_grace_s, 0, MAX_MISFIRE_GRACE_S)
    _check_choice("overlap_policy", overlap_policy, OVERLAP_POLICIES)
    if start_at is not None:
        if interval_s is None:
            raise TaskValidationError("start_at", start_at, "only with interval_s")
        _check_int("start_at", start_at, 0, 2**53)
    moment = await _now(db, now)
    current = floor_epoch(moment)
    anchor = None if interval_s is None else (current if start_at is None else start_at)
    cadence = make_cadence(cron=cron, interval_s=interval_s, timezone=timezone, anchor_at=anchor)
    template = validate_application(
        TaskApplication(
            action_kind=action_kind,
            args=args if args is not None else {},
            execution_target=execution_target,
            idempotency_key=_TEMPLATE_KEY,
            required_capabilities=list(required_capabilities),
            library_ref=library_ref,
            library_content_hash=library_content_hash,
        ),
        registry if registry is not None else build_registry(),
    )
    next_fire_at = cadence.next_after(current)
    if next_fire_at is None:
        raise TaskValidationError(
            "cron", cron, f"an expression that matches within {HORIZON_YEARS} years"
        )
    row = await db.fetchone(
        "schedule_insert",
        {
            "id": new_id(),
            "name": name,
            "cron_expression": cadence.cron.source if cadence.cron else None,
            "interval_s": interval_s,
            "anchor_at": anchor,
            "timezone": timezone,
            "enabled": bool(enabled),
            "action_kind": template.action_kind,
            "action_args": template.args_json,
            "execution_target": template.execution_target,
            "required_capabilities": dumps(template.required_capabilities),
            "library_ref": template.library_ref,
            "library_content_hash": template.library_content_hash,
            "misfire_policy": misfire_policy,
            "catch_up_max": catch_up_max,
            "misfire_grace_s": misfire_grace_s,
            "overlap_policy": overlap_policy,
            "next_fire_at": next_fire_at,
            "now": moment,
        },
    )
    if row is None:
        existing = await db.fetchone("schedule_get_by_name", {"name": name})
        raise TaskValidationError(
            "name",
            name,
            "a name no live schedule uses",
            message=f"name {name!r} is already used by schedule "
            f"{existing['id'] if existing else '?'}; choose another or remove that schedule",
        )
    return _normalize(row)


async def get_schedule(db: StateDB, schedule_ref: str) -> Row:
    """The schedule with this id (removed ones too), else the live one with this name.

    Raises:
        ScheduleNotFound: neither matches.
    """
    # No row holds a NUL or a lone surrogate (admission refuses both): not found, without SQL.
    if not isinstance(schedule_ref, str):
        raise ScheduleNotFound(repr(schedule_ref))
    if "\x00" in schedule_ref or shown_text(schedule_ref) != schedule_ref:
        raise ScheduleNotFound(shown_text(schedule_ref))
    row = await db.fetchone("schedule_get", {"id": schedule_ref})
    if row is None:
        row = await db.fetchone("schedule_get_by_name", {"name": schedule_ref})
    if row is None:
        raise ScheduleNotFound(schedule_ref)
    return _normalize(row)


async def list_schedules(
    db: StateDB, *, include_removed: bool = False, limit: int = 100
) -> list[Row]:
    """Schedules, oldest first; removed ones (R11: kept, disabled) only when asked for."""
    _check_int("limit", limit, 1, MAX_LIST_LIMIT)
    rows = await db.fetchall(
        "schedule_list", {"include_removed": bool(include_removed), "limit": limit}
    )
    return [_normalize(r) for r in rows]


def _refuse_removed(row: Row, action: str) -> None:
    if row["removed_at"] is not None:
        raise TaskValidationError(
            "schedule",
            row["id"],
            "a schedule that is not removed",
            message=f"schedule {row['id']} ({row['name']}) was removed and cannot be {action}; "
            "removed schedules stay disabled (R11): add a new one",
        )


async def enable_schedule(db: StateDB, schedule_ref: str, *, now: float | None = None) -> Row:
    """Enable a schedule; it resumes at the first nominal time after ``now`` (times passed while
    it was disabled are not misfires). Enabling an enabled schedule changes nothing.

    Raises:
        ScheduleNotFound; TaskValidationError for a removed schedule.
    """
    row = await get_schedule(db, schedule_ref)
    _refuse_removed(row, "enabled")
    if row["enabled"]:
        return row
    moment = await _now(db, now)
    updated = await db.fetchone(
        "schedule_enable",
        {
            "id": row["id"],
            "next_fire_at": cadence_of(row).next_after(floor_epoch(moment)),
            "now": moment,
        },
    )
    return _normalize(updated) if updated else await get_schedule(db, row["id"])


async def disable_schedule(db: StateDB, schedule_ref: str, *, now: float | None = None) -> Row:
    """Disable a schedule (idempotent); fires it already decided are still admitted."""
    row = await get_schedule(db, schedule_ref)
    updated = await db.fetchone("schedule_disable", {"id": row["id"], "now": now})
    return _normalize(updated) if updated else row


async def remove_schedule(db: StateDB, schedule_ref: str, *, now: float | None = None) -> Row:
    """Remove a schedule: disable it and mark it removed, never delete it (R11). Idempotent.

    Its row, its counters and every run it admitted stay; its name becomes free.
    """
    row = await get_schedule(db, schedule_ref)
    updated = await db.fetchone("schedule_remove", {"id": row["id"], "now": now})
    return _normalize(updated) if updated else row


async def fire_schedule(
    db: StateDB,
    schedule_ref: str,
    *,
    idempotency_key: str | None = None,
    registry: TaskAdapterRegistry | None = None,
    now: float | None = None,
) -> str:
    """Admit the schedule's template now and return the task id — not evidence that it ran.

    The key is ``manual:<schedule-id>:<uuid4>`` (R13): generated unless the caller passes one
    of that shape (to retry the same manual fire safely). Manual fires ignore the enabled flag
    and the misfire and overlap policies, and do not move the schedule's cursor.

    Raises:
        ScheduleNotFound; TaskValidationError (a removed schedule, a malformed key, a template
        this registry rejects); TaskIdempotencyConflict.
    """
    row = await get_schedule(db, schedule_ref)
    _refuse_removed(row, "fired")
    key = manual_fire_key(row["id"]) if idempotency_key is None else idempotency_key
    check_key("idempotency_key", key)  # admission's key rule, before its shape is read
    prefix = f"manual:{row['id']}:"
    try:
        suffix = key.removeprefix(prefix)
        valid = (
            key.startswith(prefix)
            and str(uuid.UUID(suffix)) == suffix
            and uuid.UUID(suffix).version == 4
        )
    except (AttributeError, ValueError):
        valid = False
    if not valid:
        raise TaskValidationError("idempotency_key", key, f"{prefix}<uuid4>")
    return await submit_task(
        db,
        application_for(row, key),
        registry=registry,
        admission_source="schedule",
        schedule_id=row["id"],
        now=now,
    )


async def schedule_metrics(db: StateDB) -> dict[str, int]:
    """Totals for /metrics: schedules, enabled ones, recorded fires, overlap and misfire skips."""
    row = await db.fetchone("schedule_totals")
    assert row is not None
    return {name: int(value) for name, value in row.items()}


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
        moment = await _now(self.db, now)
        current = floor_epoch(moment)
        report = PassReport()
        rows = await self.db.fetchall(
            "schedule_due",
            {"now": current, "kinds": dumps(self.registry.kinds()), "limit": self.batch},
        )
        for row in rows:
            report.evaluated += 1
            await self._evaluate(_normalize(row), moment, current, report)
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
            row = _normalize(fresh)

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
                {"schedule_id": schedule_id, "statuses": _ACTIVE_STATUSES},
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
