"""Durations as people type them: ``90``, ``30s``, ``5m``, ``2h``, ``1d`` (a bare number is
seconds). One parser for every binding that takes one (the CLI's ``--delay`` and ``--per``, the
dashboard's rate period), so they accept and refuse the same text. Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Final

from taskward.errors import TaskValidationError

UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
ALLOWED: Final = "a duration such as 90, 30s, 5m, 2h or 1d (a bare number is seconds)"


def parse_duration(field: str, text: str) -> float:
    """``text`` as seconds (finite, >= 0); a TaskValidationError naming ``field`` otherwise."""
    raw = text.strip().lower()
    unit = UNITS.get(raw[-1:]) if raw else None
    number = raw[:-1] if unit is not None else raw
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise TaskValidationError(field, text, ALLOWED) from None
    if not math.isfinite(value) or value < 0:
        raise TaskValidationError(field, text, ALLOWED)
    return value
