"""The scheduling fields of an application (DESIGN.md R15-R18, R20): their allowed values, the
checks that name the field and what is allowed (R14), and the one binding convenience, a delay
resolved against its key (``run_after_for_delay``). Admission runs the checks before any SQL;
``limits`` shares the limit key's rule.
"""

from __future__ import annotations

from typing import Final

from taskward.errors import TaskValidationError
from taskward.models import check_key
from taskward.registry import MAX_ATTEMPTS_LIMIT
from taskward.store.port import StateDB

# R16-R18, R20: the allowed values of the scheduling fields, named in their errors.
MIN_PRIORITY: Final = -100
MAX_PRIORITY: Final = 100
MAX_TASK_ATTEMPTS: Final = MAX_ATTEMPTS_LIMIT  # one range for tasks and kinds (R18)
# run_after: epoch seconds from 0 to the start of 2200 (a finite time every binding can show).
MAX_RUN_AFTER: Final = 7258118400.0
LIMIT_KEY_ALLOWED: Final = (
    "null or a key of 1..255 printable characters not starting with 'kind:' (every task has "
    "the implicit limit key kind:<action_kind>)"
)


MAX_DELAY_S: Final = 10 * 366 * 86400.0


def check_delay(field: str, value: object) -> float:
    """A binding's delay in seconds (R15's ``delay_s``): a number from 0 to ten years."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_DELAY_S
    ):
        raise TaskValidationError(field, value, f"seconds from 0 to {MAX_DELAY_S:.0f} (ten years)")
    return float(value)


async def run_after_for_delay(
    db: StateDB, idempotency_key: str, delay_s: float, *, now: float | None = None
) -> float:
    """R16's binding convenience (CLI ``--delay``, HTTP ``delay_s``): ``now + delay_s``, unless
    the key already admitted a task, whose own ``run_after`` is returned instead.

    A delay is relative to when a request arrives, so a retried request would otherwise name
    another ``run_after`` than its first try and conflict (R15 hashes ``run_after``); resolved
    against the key, the retry replays. A task of that key admitted without a delay keeps a
    conflict: it is another application."""
    delay = check_delay("delay_s", delay_s)
    key = check_key("idempotency_key", idempotency_key.strip())
    existing = await db.fetchone("run_get_by_key", {"idempotency_key": key})
    if existing is not None and existing["run_after"] is not None:
        return float(existing["run_after"])
    return (await db.now() if now is None else now) + delay


def check_run_after(field: str, value: object) -> float | None:
    """R16: None, or epoch seconds in [0, ``MAX_RUN_AFTER``] (a number, not a bool)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_RUN_AFTER
    ):
        raise TaskValidationError(
            field, value, f"null or epoch seconds from 0 to {MAX_RUN_AFTER:.0f} (year 2200)"
        )
    return float(value)


def check_priority(field: str, value: object) -> int:
    """R17: an integer in [-100, 100]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (MIN_PRIORITY <= value <= MAX_PRIORITY)
    ):
        raise TaskValidationError(
            field, value, f"an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (higher first)"
        )
    return value


def check_max_attempts(field: str, value: object) -> int | None:
    """R18: None (the kind's default, else the queue's ceiling) or an integer in [1, 100]."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (1 <= value <= MAX_TASK_ATTEMPTS)
    ):
        raise TaskValidationError(field, value, f"null or an integer from 1 to {MAX_TASK_ATTEMPTS}")
    return value


def check_limit_key(field: str, value: object) -> str | None:
    """R20: None or a printable key (the idempotency key's rule) outside the ``kind:`` space."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TaskValidationError(field, value, LIMIT_KEY_ALLOWED)
    try:
        check_key(field, value)
    except TaskValidationError as exc:
        raise TaskValidationError(field, exc.value, LIMIT_KEY_ALLOWED) from exc
    if value != value.strip() or value.startswith("kind:"):
        raise TaskValidationError(field, value, LIMIT_KEY_ALLOWED)
    return value


# R21: how many tasks one task may depend on. A fan-in over a thousand parents fits; the ids
# join the application's hash (sorted), so the bound also bounds what is hashed and stored.
MAX_DEPENDENCIES: Final = 1000
MAX_TASK_ID_LENGTH: Final = 64
DEPENDS_ON_ALLOWED: Final = (
    f"a list of at most {MAX_DEPENDENCIES} task ids (strings of 1..{MAX_TASK_ID_LENGTH} "
    "printable characters), each an existing task"
)


def check_depends_on(field: str, value: object) -> tuple[str, ...]:
    """R21: a list of task ids, returned sorted and de-duplicated (R15: the form that is hashed
    and stored). Whether each id exists is the admission transaction's check (it locks them)."""
    if (type(value) is list or type(value) is tuple) and not value:
        return ()
    if not isinstance(value, list | tuple | set | frozenset):
        raise TaskValidationError(field, type(value).__name__, DEPENDS_ON_ALLOWED)
    if len(value) > MAX_DEPENDENCIES:
        raise TaskValidationError(field, f"{len(value)} ids", DEPENDS_ON_ALLOWED)
    for item in value:
        if (
            not isinstance(item, str)
            or not item
            or len(item) > MAX_TASK_ID_LENGTH
            or not item.isprintable()
            or item != item.strip()
        ):
            raise TaskValidationError(field, item, DEPENDS_ON_ALLOWED)
    return tuple(sorted(set(value)))


__all__ = [
    "MAX_DEPENDENCIES",
    "check_delay",
    "check_depends_on",
    "check_limit_key",
    "check_max_attempts",
    "check_priority",
    "check_run_after",
    "run_after_for_delay",
]
