"""The reapers' function surface where it has always been imported from (the worker, the
runtime, the CLI and tests): re-exports only. The services live beside it (see the package
docstring): ``leases``, ``retries`` (with ``ceiling``), ``deadlines``, run in order by
``composite``.
"""

from taskward.maintenance.composite import (
    promote_due_retries,
    reap_deadlines,
    reap_expired_leases,
)
from taskward.maintenance.deadlines import DEFAULT_DEADLINE_GRACE_SECONDS
from taskward.maintenance.service import REAP_BATCH
from taskward.transitions.recovery import REAPER

__all__ = [
    "DEFAULT_DEADLINE_GRACE_SECONDS",
    "REAPER",
    "REAP_BATCH",
    "promote_due_retries",
    "reap_deadlines",
    "reap_expired_leases",
]
