"""Mutant (a), loaded with ``-p``: terminal writes lose their lease guard, so any worker's
acknowledgement overwrites a running row whoever holds it now (breaks R4)."""

from __future__ import annotations

from typing import Any

from taskward.claims import Lease
from tests.mutants._profile import pytest_configure  # noqa: F401 (a hook of this plugin)


def _no_guard(self: Lease) -> dict[str, Any]:
    return {}


Lease.guard = _no_guard  # type: ignore[method-assign]
