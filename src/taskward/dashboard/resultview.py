"""The task page's result (R22): a completed task's stored return value, pretty-printed in a
monospace block cut at ``RESULT_PREVIEW_BYTES``, with a link to the whole value
(``/ui/data/tasks/{id}/result``, the same JSON as ``GET /api/tasks/{id}/result``). Pure:
the page's handler reads the stored result (``results.read_task_result``).
"""

from __future__ import annotations

import json
from typing import Any, Final
from urllib.parse import quote

from taskward.results import StoredResult

# How much of a pretty-printed result the page shows (UTF-8 bytes); the link has the rest.
RESULT_PREVIEW_BYTES: Final = 4096

Region = dict[str, Any]


def result_href(task_id: str) -> str:
    """Where the dashboard serves a task's whole stored result, as JSON."""
    return f"/ui/data/tasks/{quote(task_id, safe='')}/result"


def result_regions(task_id: str, stored: StoredResult | None) -> dict[str, Region]:
    """The page's result regions: ``result-section`` shown for a completed task only,
    ``result`` its value pretty-printed (cut, saying so, past ``RESULT_PREVIEW_BYTES``) and
    ``result-link`` the whole value."""
    if stored is None:
        return {
            "result-section": {"kind": "toggle", "visible": False},
            "result": {"kind": "pre", "text": ""},
            "result-link": {"kind": "link", "href": None, "text": ""},
        }
    text = json.dumps(stored.result, indent=2, ensure_ascii=False)
    encoded = text.encode("utf-8")
    size = len(encoded)
    if size > RESULT_PREVIEW_BYTES:
        cut = encoded[:RESULT_PREVIEW_BYTES].decode("utf-8", errors="ignore")
        text = f"{cut}\n… (cut at {RESULT_PREVIEW_BYTES} of {size} bytes)"
    return {
        "result-section": {"kind": "toggle", "visible": True},
        "result": {"kind": "pre", "text": text},
        "result-link": {
            "kind": "link",
            "href": result_href(task_id),
            "text": f"whole result (JSON, attempt {stored.attempt})",
        },
    }
