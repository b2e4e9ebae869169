"""Bulk actions on the task list's selection: cancel or retry the selected tasks (``POST
/tasks/bulk``). CSRF-protected and needing the ``operate`` scope like every form post
(``actions._operate``); each task goes through the library's one function (``cancellation.
request_task_cancel``, ``resubmit.retry_task``, R19) with the form's one key, drawn when the
list was rendered, so sending the same form twice cancels or admits nothing new. Back on the
list, a flash says what was done (``listviews.BULK_FLASH``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response

from taskward.cancellation import request_task_cancel
from taskward.dashboard.actions import bulk_ids, form_key, operate
from taskward.dashboard.render import safe_next
from taskward.errors import (
    TaskIdempotencyConflict,
    TaskNotFound,
    TaskNotRetryable,
    TaskValidationError,
)
from taskward.resubmit import retry_task
from taskward.store import StateDB
from taskward.web.auth import Principal
from taskward.web.state import services_of

router = APIRouter(include_in_schema=False)

ACTIONS: Final = ("cancel", "retry")
# The list's own flash parameters, dropped from ``next`` before a new one is added.
_FLASH_PARAMS: Final = frozenset({"done", "n", "of"})


def back_to(next_url: str, done: str, n: int, of: int) -> str:
    """The list the form came from (a local path only), with the flash of what was done."""
    target = safe_next(next_url or "/tasks")
    parts = urlsplit(target)
    if parts.path != "/tasks":
        target, parts = "/tasks", urlsplit("/tasks")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in _FLASH_PARAMS]
    query += [("done", done), ("n", str(n)), ("of", str(of))]
    return "/tasks?" + urlencode(query)


@router.post("/tasks/bulk")
async def bulk_action(request: Request) -> Response:
    """Cancel or retry (``action``) each selected task (``task_id``, repeated). A task that
    cannot be (a retry of one not ended, an id not found, a cancel of one already ended) is
    counted as not done; the flash says how many of the selected were."""
    services = services_of(request)

    async def run(db: StateDB, principal: Principal, form: Mapping[str, str]) -> str:
        action = form.get("action") or ""
        if action not in ACTIONS:
            raise TaskValidationError("action", action[:40], list(ACTIONS))
        ids = bulk_ids(form.get("task_id") or "")
        if not ids:
            return back_to(form.get("next") or "", "none", 0, 0)
        key = form_key(form, f"ui:bulk:{uuid.uuid4()}")
        done = 0
        requested = 0
        for task_id in ids:
            try:
                if action == "retry":
                    await retry_task(
                        db,
                        task_id,
                        actor=principal.actor(),
                        idempotency_key=key,
                        registry=services.registry,
                    )
                    done += 1
                    continue
                result = await request_task_cancel(
                    db,
                    task_id,
                    actor=principal.actor(),
                    idempotency_key=key,
                    reason="cancelled from the dashboard's list",
                )
            except (TaskNotRetryable, TaskNotFound, TaskIdempotencyConflict):
                continue
            if result.state == "cancelled":
                done += 1
            elif result.state == "cancellation_requested":
                done += 1
                requested += 1
        word = "retried" if action == "retry" else "requested" if requested else "cancelled"
        return back_to(form.get("next") or "", word, done, len(ids))

    return await operate(request, run)
