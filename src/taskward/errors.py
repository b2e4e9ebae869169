"""The taskward error tree: every error a caller can catch, in one place.

    TaskwardError
    ├── TaskValidationError(ValueError)      bad input: names field, value and what is allowed
    │   ├── AdapterNotRegistered             action_kind no registered adapter serves
    │   ├── InvalidTransition                undeclared lifecycle edge, bad reason/guard/patch
    │   └── NotificationNotRetryable         outbox retry of a row not dead_letter/expired
    ├── TaskIdempotencyConflict(ValueError)  same admission key, different application hash
    ├── TransitionIdempotencyConflict(ValueError)  same transition key, different request
    ├── TaskNotFound(LookupError)            no schedule_runs row with that id
    ├── TaskNotCompleted(LookupError)        R22: no result to read, the task is not completed
    ├── ScheduleNotFound(LookupError)        no live schedule with that id or name
    ├── NotificationNotFound(LookupError)    no dispatch_outbox row with that id
    └── StoreError                           the store failed (driver error translated once)
        └── StoreUnavailable                 the store could not be reached or stayed locked

Validation errors subclass ValueError and ``TaskNotFound`` subclasses LookupError, as the
records require (DESIGN.md R14).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class TaskwardError(Exception):
    """Base class of every error taskward raises on purpose."""


class TaskValidationError(TaskwardError, ValueError):
    """Input was rejected before anything was written (R14).

    ``field`` names the offending field, ``value`` is what was given and ``allowed`` describes
    what would have been accepted.
    """

    def __init__(
        self, field: str, value: Any, allowed: str | Iterable[str], *, message: str | None = None
    ) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed if isinstance(allowed, str) else ", ".join(allowed)
        self.message = message or f"{field} {value!r} is invalid; allowed: {self.allowed}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class AdapterNotRegistered(TaskValidationError):
    """The action kind names no adapter registered in this deployment (ADR-0072 D4)."""

    def __init__(self, kind: Any, registered: Iterable[str], aliases: dict[str, str]) -> None:
        kinds = sorted(registered)
        alias_text = ", ".join(f"{a} -> {c}" for a, c in sorted(aliases.items()))
        message = f"action_kind {kind!r} is not registered; registered kinds: {', '.join(kinds)}"
        if alias_text:
            message += f"; aliases: {alias_text}"
        super().__init__("action_kind", kind, kinds, message=message)
        self.registered = kinds
        self.aliases = dict(aliases)


class InvalidTransition(TaskValidationError):
    """A transition request was rejected by a static check before any write (R3)."""


class TaskIdempotencyConflict(TaskwardError, ValueError):
    """The idempotency key already admitted a different application (ADR-0072 D2)."""

    def __init__(self, key: str, existing_task_id: str) -> None:
        self.key = key
        self.existing_task_id = existing_task_id
        super().__init__(
            f"idempotency_key {key!r} already admitted task {existing_task_id} with a different"
            " application; use a new key for different work"
        )


class TransitionIdempotencyConflict(TaskwardError, ValueError):
    """A transition idempotency key was reused with different content (ADR-0072 D3)."""

    def __init__(self, entity_id: str, key: str, transition_id: str) -> None:
        self.entity_id = entity_id
        self.key = key
        self.transition_id = transition_id
        super().__init__(
            f"transition idempotency_key {key!r} of task {entity_id} was already used by"
            f" transition {transition_id} with different content"
        )


class TaskNotFound(TaskwardError, LookupError):
    """No task (schedule_runs row) has this id."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id!r} not found")


class TaskNotCompleted(TaskwardError, LookupError):
    """A task's result was asked for while the task is not ``completed`` (R22): there is no
    result to look up (yet, or ever: a failed task has none). ``status``: what the task is."""

    def __init__(self, task_id: str, status: str) -> None:
        self.task_id = task_id
        self.status = status
        super().__init__(f"task {task_id!r} is {status}, not completed: it has no result")


class TaskNotRetryable(TaskwardError, ValueError):
    """An operator retry (R19) of a task that has not ended: only a terminal task is retried
    (it runs again as a new task); one still in the queue or running is left to its course."""

    def __init__(self, task_id: str, status: str) -> None:
        self.task_id = task_id
        self.status = status
        super().__init__(
            f"task {task_id} is {status}: only a terminal task (completed, failed, timed_out, "
            "cancelled, skipped) can be retried"
        )


class ScheduleNotFound(TaskwardError, LookupError):
    """No schedule has this id (or, for a name, no schedule that is not removed)."""

    def __init__(self, schedule_ref: str) -> None:
        self.schedule_ref = schedule_ref
        super().__init__(f"schedule {schedule_ref!r} not found")


class StoreError(TaskwardError):
    """The store failed; the driver's error is the ``__cause__``."""


class StoreUnavailable(StoreError):
    """The store could not be reached, or stayed locked past the retry budget."""


class NotificationNotFound(TaskwardError, LookupError):
    """No dispatch_outbox row has this id (it may have been purged)."""

    def __init__(self, notification_id: str) -> None:
        self.notification_id = notification_id
        super().__init__(f"notification {notification_id!r} not found in the outbox")


class NotificationNotRetryable(TaskValidationError):
    """An operator retry names a notification that is not dead_letter or expired (R12)."""

    def __init__(self, notification_id: str, status: str) -> None:
        super().__init__(
            "status",
            status,
            "dead_letter, expired",
            message=f"notification {notification_id} is {status}; only dead_letter or expired"
            " notifications can be retried",
        )
        self.notification_id = notification_id
