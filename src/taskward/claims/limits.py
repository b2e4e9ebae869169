"""Limits inside a claim pass (DESIGN.md R20): which kinds and limit keys a pass leaves out of
its pages, and how many of its candidates each limited key still admits. Reads and one log
write (the claims of keys with a rate); the claims themselves are ``passes``'.

Every task has the implicit key ``kind:<action_kind>`` and, when it gave one, its
``limit_key``. A key with a limit admits a claim only while its running rows stay below
``max_running`` (0: paused) and its claims in the last ``period_s`` below ``rate``.

Invariant (R20): a key's count and its claims are decided under the key's lock. On PostgreSQL
a pass locks the limit rows of the keys its candidates carry (``limit_lock``: FOR UPDATE SKIP
LOCKED, so a pass never waits) and only then counts them (``limit_state``, a later statement
with a later snapshot): two claimers on two machines cannot both take a key's last slot, and a
key another pass holds admits nothing in this one. On SQLite the pass's write lock (BEGIN
IMMEDIATE) already makes every key the pass's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskward.claims.spec import WorkerSpec
from taskward.store.port import Row, Tx

KIND_PREFIX = "kind:"


def kind_key(action_kind: str) -> str:
    """The implicit limit key of every task of ``action_kind`` (R20)."""
    return f"{KIND_PREFIX}{action_kind}"


def row_keys(row: Row) -> tuple[str, ...]:
    """The limit keys a queued row counts against: its kind's, and its own when it has one."""
    own = row.get("limit_key")
    kind = kind_key(row["action_kind"])
    return (kind, own) if own else (kind,)


@dataclass(frozen=True)
class LimitState:
    """One key's limit and what counts against it now (``limit_state``'s row)."""

    limit_key: str
    max_running: int | None
    rate: int | None
    period_s: float | None
    running: int
    recent: int

    @classmethod
    def of(cls, row: Row) -> LimitState:
        return cls(
            limit_key=row["limit_key"],
            max_running=row["max_running"],
            rate=row["rate"],
            period_s=row["period_s"],
            running=int(row["running"] or 0),
            recent=int(row["recent"] or 0),
        )

    @property
    def free(self) -> int:
        """How many more claims the key admits now (never below 0)."""
        room = []
        if self.max_running is not None:
            room.append(self.max_running - self.running)
        if self.rate is not None:
            room.append(self.rate - self.recent)
        return max(0, min(room)) if room else 0


@dataclass
class PassLimits:
    """The limits a claim pass meets: the keys held when it began (``limit_state`` with
    ``held_only``, read with its first page, unlocked), grown as the pass counts its
    candidates' keys under their locks."""

    held: set[str] = field(default_factory=set)  # keys that admit nothing more in this pass
    rated: set[str] = field(default_factory=set)  # limited keys with a rate: claims are logged

    @classmethod
    def of(cls, limited: bool, held_rows: Iterable[Row]) -> PassLimits | None:
        """None when no limit is set at all: the pass then counts nothing."""
        if not limited:
            return None
        return cls({row["limit_key"] for row in held_rows})

    def page_filter(self, spec: WorkerSpec) -> dict[str, Any] | None:
        """``run_claim_page``'s filter for this pass: the spec's kinds less those whose key is
        held, and the held keys that are not kinds (``held``); None when nothing held concerns
        this worker (its cached filter stands)."""
        held_kinds = {k[len(KIND_PREFIX) :] for k in self.held if k.startswith(KIND_PREFIX)}
        held_keys = sorted(k for k in self.held if not k.startswith(KIND_PREFIX))
        kinds = sorted(set(spec.kinds) - held_kinds)
        if not held_keys and len(kinds) == len(set(spec.kinds)):
            return None
        return {**spec.page_filter, "kinds": json.dumps(kinds), "held": json.dumps(held_keys)}

    async def admit(self, tx: Tx, candidates: Sequence[Row], *, wanted: int) -> list[Row]:
        """At most ``wanted`` of the candidates, in order, that their keys' limits admit now:
        each key's lock is taken first (PostgreSQL; a key another pass holds admits nothing in
        this one), then the limited keys' counts are read afresh, and each admitted row takes
        one free slot of each of its limited keys."""
        keys = sorted({key for row in candidates for key in row_keys(row)} - self.held)
        room: dict[str, int] = {}
        if keys:
            text = json.dumps(keys)
            # One round trip, two statements: the count's snapshot is taken when it starts,
            # after the locks are held (PostgreSQL runs a pipeline's statements in turn).
            lock_rows, fresh = await tx.fetchall_batch(
                [
                    ("limit_lock", {"keys": text}),
                    ("limit_state", {"keys": text, "now": tx.now, "held_only": False}),
                ]
            )
            locked = {row["limit_key"] for row in lock_rows}
            for row in fresh:  # only the keys that have a limit
                state = LimitState.of(row)
                key = state.limit_key
                if key not in locked or state.free <= 0:
                    self.held.add(key)
                else:
                    room[key] = state.free
                if state.rate is not None:
                    self.rated.add(key)
        admitted: list[Row] = []
        for row in candidates:
            if len(admitted) >= wanted:
                break
            keys_of = row_keys(row)
            if any(key in self.held for key in keys_of):
                continue
            for key in keys_of:
                if key in room:
                    room[key] -= 1
                    if room[key] <= 0:
                        self.held.add(key)
            admitted.append(row)
        return admitted

    async def record(self, tx: Tx, claimed: Iterable[Row]) -> None:
        """Log each claim of a key with a rate (its sliding window), pruning what left it."""
        rows = [
            {"limit_key": key, "task_id": row["id"]}
            for row in claimed
            for key in row_keys(row)
            if key in self.rated
        ]
        if rows:
            keys = json.dumps(sorted({r["limit_key"] for r in rows}))
            await tx.execute("limit_claims_prune", {"keys": keys, "now": tx.now})
            await tx.write_many([("limit_claim_insert_many", rows)])
