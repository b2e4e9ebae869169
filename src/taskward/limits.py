"""Operators' limits and pauses (DESIGN.md R20): ``set_limit``, ``clear_limit``,
``list_limits``, ``pause_kind`` and ``resume_kind``. The one writer of ``task_limits``; what a
limit does to a claim is ``claims.limits``'.

A limit is per key: ``kind:<action_kind>`` (every task has it) or a task's own ``limit_key``
(``tenant:acme``). ``max_running`` bounds the key's running tasks (0 pauses it); ``rate`` with
``period_s`` bounds its claims in any window of ``period_s`` seconds. Setting a key's limit
replaces it whole. Raising or clearing a limit wakes idle workers.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from taskward.claims.limits import KIND_PREFIX, LimitState, kind_key
from taskward.errors import TaskValidationError
from taskward.fields import check_limit_key
from taskward.models import Actor, check_text
from taskward.store.port import Row, StateDB

MAX_LIMIT_VALUE: Final = 1_000_000
MAX_PERIOD_S: Final = 366 * 86400.0
KEY_ALLOWED: Final = (
    "kind:<action_kind>, or a task limit key (1..255 printable characters, not starting "
    "with 'kind:')"
)


def check_key(field: str, key: object) -> str:
    """A limit's key: ``kind:<kind>`` (a kind's name: no whitespace) or a task's limit key."""
    if not isinstance(key, str):
        raise TaskValidationError(field, key, KEY_ALLOWED)
    if key.startswith(KIND_PREFIX):
        kind = key[len(KIND_PREFIX) :]
        check_text(field, key)
        if not kind or len(key) > 255 or any(c.isspace() for c in kind) or not kind.isprintable():
            raise TaskValidationError(field, key, KEY_ALLOWED)
        return key
    checked = check_limit_key(field, key)
    assert checked is not None
    return checked


def _count(field: str, value: object, low: int, *, allowed: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_LIMIT_VALUE:
        raise TaskValidationError(field, value, allowed)
    return value


def _limit_row(row: Row) -> dict[str, Any]:
    state = LimitState.of(row)
    return {
        "limit_key": state.limit_key,
        "max_running": state.max_running,
        "rate": state.rate,
        "period_s": state.period_s,
        "paused": state.max_running == 0,
        "resumes_to": row["resume_max_running"],
        "running": state.running,
        "recent": state.recent,
        "free": state.free,
        "updated_at": row["updated_at"],
        "updated_by": row["updated_by"],
    }


async def set_limit(
    db: StateDB,
    key: str,
    *,
    max_running: int | None = None,
    rate: int | None = None,
    period_s: float | None = None,
    actor: Actor | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Store ``key``'s limit, replacing any it had (R20), and return it as ``list_limits`` does.

    Raises:
        TaskValidationError: a bad key, ``max_running`` outside 0..1,000,000, ``rate`` outside
            1..1,000,000, ``period_s`` not in (0, 366 days], a rate without a period (or the
            reverse), or neither a ``max_running`` nor a rate. Nothing is stored.
    """
    key = check_key("limit_key", key)
    running = _count(
        "max_running",
        max_running,
        0,
        allowed=f"null or an integer from 0 (paused) to {MAX_LIMIT_VALUE:,}",
    )
    per = _count("rate", rate, 1, allowed=f"null or an integer from 1 to {MAX_LIMIT_VALUE:,}")
    if period_s is not None and (
        isinstance(period_s, bool)
        or not isinstance(period_s, int | float)
        or not (math.isfinite(period_s) and 0 < period_s <= MAX_PERIOD_S)
    ):
        raise TaskValidationError(
            "period_s", period_s, f"null or seconds > 0 and <= {MAX_PERIOD_S:.0f} (366 days)"
        )
    if (per is None) != (period_s is None):
        raise TaskValidationError(
            "rate",
            {"rate": rate, "period_s": period_s},
            "rate and period_s together (N claims per period_s seconds), or neither",
        )
    if running is None and per is None:
        raise TaskValidationError(
            "max_running", None, "a max_running, a rate with its period_s, or both"
        )
    async with db.transaction(now=now) as tx:
        await tx.execute(
            "limit_put",
            {
                "limit_key": key,
                "max_running": running,
                "rate": per,
                "period_s": None if period_s is None else float(period_s),
                "updated_by": actor.label() if actor is not None else None,
                "now": tx.now,
            },
        )
        [row] = await tx.fetchall(
            "limit_state", {"keys": json.dumps([key]), "now": tx.now, "held_only": False}
        )
        # A limit raised (or a pause lifted) may let queued rows run: wake idle workers.
        tx.notify("queued")
    return _limit_row(row)


async def clear_limit(db: StateDB, key: str, *, now: float | None = None) -> bool:
    """Remove ``key``'s limit (and its window of claims); True if it had one."""
    key = check_key("limit_key", key)
    async with db.transaction(now=now) as tx:
        removed = await tx.execute("limit_delete", {"limit_key": key})
        await tx.execute("limit_claims_delete", {"limit_key": key})
        if removed:
            tx.notify("queued")
    return bool(removed)


async def get_limit(db: StateDB, key: str, *, now: float | None = None) -> dict[str, Any] | None:
    """``key``'s limit with its counts now, or None."""
    key = check_key("limit_key", key)
    rows = await list_limits(db, now=now, keys=[key])
    return rows[0] if rows else None


async def list_limits(
    db: StateDB, *, now: float | None = None, keys: list[str] | None = None
) -> list[dict[str, Any]]:
    """Every limit (or those of ``keys``) by key, each with what counts against it now:
    ``running``, ``recent`` (claims in its rate window) and ``free`` (claims it admits now)."""
    if now is None:
        now = await db.now()
    params = {"keys": None if keys is None else json.dumps(keys), "now": now, "held_only": False}
    return [_limit_row(row) for row in await db.fetchall("limit_state", params)]


async def pause_kind(
    db: StateDB, kind: str, *, actor: Actor | None = None, now: float | None = None
) -> dict[str, Any]:
    """Pause ``kind``: ``max_running`` 0 on ``kind:<kind>`` (R20), in one statement that keeps
    the key's rate and remembers the ``max_running`` it had, which ``resume_kind`` restores. No
    new claim takes the kind; running tasks run on."""
    key = check_key("kind", kind_key(kind) if isinstance(kind, str) else kind)
    async with db.transaction(now=now) as tx:
        by = actor.label() if actor is not None else None
        await tx.execute("limit_pause", {"limit_key": key, "updated_by": by, "now": tx.now})
        [row] = await tx.fetchall(
            "limit_state", {"keys": json.dumps([key]), "now": tx.now, "held_only": False}
        )
    return _limit_row(row)


async def resume_kind(
    db: StateDB, kind: str, *, actor: Actor | None = None, now: float | None = None
) -> bool:
    """Lift a pause of ``kind``: the ``max_running`` it had before the pause comes back (a
    rate stays); a limit that was only the pause is removed. True if the kind was paused."""
    key = check_key("kind", kind_key(kind) if isinstance(kind, str) else kind)
    async with db.transaction(now=now) as tx:
        by = actor.label() if actor is not None else None
        removed = await tx.execute("limit_resume_delete", {"limit_key": key})
        restored = await tx.execute(
            "limit_resume", {"limit_key": key, "updated_by": by, "now": tx.now}
        )
        if removed or restored:
            tx.notify("queued")
    return bool(removed or restored)
