"""Mutant (b), loaded with ``-p``: the lease reaper reads a huge attempt ceiling instead of the
row's own, so an expired lease on the last attempt goes back to the queue instead of failing
(breaks R6, R18)."""

from __future__ import annotations

from typing import Any

from taskward.maintenance.leases import LeaseReaper
from taskward.store.port import Row, StateDB
from tests.mutants._profile import pytest_configure  # noqa: F401 (a hook of this plugin)

_run_once = LeaseReaper.run_once


class _NoCeiling:
    """The store, with every expired lease's row reporting a ceiling no attempt reaches."""

    def __init__(self, db: StateDB) -> None:
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    async def fetchall(self, name: str, params: Any = None) -> list[Row]:
        rows = await self._db.fetchall(name, params)
        if name == "run_expired_leases":
            rows = [{**row, "max_attempts": 1_000_000_000} for row in rows]
        return rows


async def _ignoring_the_ceiling(
    self: LeaseReaper, db: StateDB, *, now: float | None = None
) -> dict[str, int]:
    return await _run_once(self, _NoCeiling(db), now=now)  # type: ignore[arg-type]


LeaseReaper.run_once = _ignoring_the_ceiling  # type: ignore[method-assign]
