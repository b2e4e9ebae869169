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

from taskward.schedules.definitions import (
    DEFAULT_CATCH_UP_MAX,
    DEFAULT_MISFIRE_GRACE_S,
    DEFAULT_MISFIRE_POLICY,
    DEFAULT_OVERLAP_POLICY,
    MAX_CATCH_UP,
    MAX_LIST_LIMIT,
    MAX_MISFIRE_GRACE_S,
    MAX_NAME_LENGTH,
    MISFIRE_POLICIES,
    OVERLAP_POLICIES,
    application_for,
    cadence_of,
    create_schedule,
    disable_schedule,
    enable_schedule,
    fire_schedule,
    get_schedule,
    list_schedules,
    manual_fire_key,
    remove_schedule,
    schedule_fire_key,
    schedule_metrics,
)
from taskward.schedules.scheduler import (
    CAS_ATTEMPTS,
    DEFAULT_BATCH,
    DEFAULT_INTERVAL_S,
    MISFIRE_COUNT_CAP,
    FirePlan,
    PassReport,
    Scheduler,
    SchedulerMetrics,
    SchedulerState,
    plan_fires,
)

__all__ = [
    "CAS_ATTEMPTS",
    "DEFAULT_BATCH",
    "DEFAULT_CATCH_UP_MAX",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_MISFIRE_GRACE_S",
    "DEFAULT_MISFIRE_POLICY",
    "DEFAULT_OVERLAP_POLICY",
    "FirePlan",
    "MAX_CATCH_UP",
    "MAX_LIST_LIMIT",
    "MAX_MISFIRE_GRACE_S",
    "MAX_NAME_LENGTH",
    "MISFIRE_COUNT_CAP",
    "MISFIRE_POLICIES",
    "OVERLAP_POLICIES",
    "PassReport",
    "Scheduler",
    "SchedulerMetrics",
    "SchedulerState",
    "application_for",
    "cadence_of",
    "create_schedule",
    "disable_schedule",
    "enable_schedule",
    "fire_schedule",
    "get_schedule",
    "list_schedules",
    "manual_fire_key",
    "plan_fires",
    "remove_schedule",
    "schedule_fire_key",
    "schedule_metrics",
]
