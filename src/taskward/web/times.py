"""ISO 8601 times beside epoch seconds in the HTTP API's JSON answers.

The store keeps times as epoch seconds and the API returns them as they are (``created_at``,
a number); every such field also gets an ISO 8601 UTC twin named ``<field>_iso``
(``created_at_iso: "2026-12-05T09:31:12.761Z"``; ``null`` when the time is ``null``). A time
field is a key ending in ``_at``, or ``run_after``, of the answer itself or of a row in one of
its top-level lists (``tasks``, ``transitions``, ``schedules`` ...): never inside a task's
``action_args``, ``result`` or evidence, which are the caller's data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from fastapi.responses import JSONResponse

ISO_SUFFIX: Final = "_iso"
# Keys whose lists hold rows (each row gets its twins); any other list is left alone.
ROW_LISTS: Final = frozenset(
    {
        "tasks",
        "transitions",
        "schedules",
        "workers",
        "limits",
        "parents",
        "children",
        "notifications",
        "cancel_requests",
    }
)


def is_time_field(name: str) -> bool:
    return name.endswith("_at") or name == "run_after"


def iso_time(value: Any) -> str | None:
    """Epoch seconds -> ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    try:
        moment = datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def with_iso_times(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with a ``<field>_iso`` twin after each time field (shallow: values that are
    objects are not entered)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key.endswith(ISO_SUFFIX) and is_time_field(key[: -len(ISO_SUFFIX)]):
            continue  # recomputed beside its field, never trusted from the row
        out[key] = value
        if isinstance(key, str) and is_time_field(key):
            out[key + ISO_SUFFIX] = iso_time(value)
    return out


def add_iso_times(content: Any) -> Any:
    """An answer with ISO twins on its own time fields and on its listed rows' (see above)."""
    if not isinstance(content, Mapping):
        return content
    answer = with_iso_times(content)
    for key, value in answer.items():
        if key in ROW_LISTS and isinstance(value, list):
            answer[key] = [with_iso_times(v) if isinstance(v, Mapping) else v for v in value]
    return answer


class IsoTimesJSONResponse(JSONResponse):
    """The API's JSON answer class: every answer carries the ISO twins."""

    def render(self, content: Any) -> bytes:
        return super().render(add_iso_times(content))
