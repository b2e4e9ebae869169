"""Mutant (b), loaded with ``-p``: the reaper reads a huge attempt ceiling, so an expired lease on
the last attempt goes back to the queue instead of failing (breaks R6)."""

from __future__ import annotations

from taskward.maintenance import ceiling, composite, leases, retries
from taskward.store.port import StateDB
from tests.mutants._profile import pytest_configure  # noqa: F401 (a hook of this plugin)


async def _no_ceiling(db: StateDB) -> int:
    return 1_000_000_000


# Every module of the maintenance services that reads the ceiling.
for _module in (composite, leases, retries, ceiling):
    _module.get_max_attempts = _no_ceiling  # type: ignore[attr-defined]
