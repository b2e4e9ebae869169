"""Time sources. Every time-dependent function takes ``now=``; this module owns the default.

Times are epoch seconds (float), as in the records' tables.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> float: ...


def system_clock() -> float:
    """The local wall clock in epoch seconds."""
    return time.time()
