"""Dashboard form posts: cancel a task, retry an ended task (one, or every one a list page
shows), fire/enable/disable a schedule, retry a notification, set/clear a limit and pause/resume
a kind, prune a stopped or stale worker, log in and out. Each state change
needs a session, its CSRF token and the ``operate`` scope, and goes through the same library
function as the API.

Failed logins count against the client's failed-authentication limit shared with the API's
bearer tokens (``taskward.web.throttle``); logging out revokes the session in the store
(``session.revoke_session``).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from taskward.cancellation import request_task_cancel
from taskward.dashboard import pages, views
from taskward.dashboard.render import forbidden, html, read_form, safe_next, secure
from taskward.dashboard.session import (
    CSRF_FIELD,
    CSRF_HEADER,
    clear_session_cookie,
    csrf_matches,
    new_session,
    revoke_session,
    session_principal,
    set_session_cookie,
)
from taskward.durations import parse_duration
from taskward.errors import (
    NotificationNotFound,
    ScheduleNotFound,
    StoreError,
    TaskIdempotencyConflict,
    TaskNotFound,
    TaskNotRetryable,
    TaskValidationError,
)
from taskward.heartbeat import prune_workers
from taskward.limits import clear_limit, pause_kind, resume_kind, set_limit
from taskward.models import check_key
from taskward.outbox import retry_notification
from taskward.resubmit import retry_task
from taskward.schedules import disable_schedule, enable_schedule, fire_schedule, get_schedule
from taskward.store import StateDB
from taskward.web.auth import Principal, client_of, find_token
from taskward.web.state import services_of

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class ResultPage:
    """What an operation shows instead of redirecting: a template and its context."""

    template: str
    context: dict[str, Any] = field(default_factory=dict)
    status_code: int = 200


Operation = Callable[[StateDB, Principal, Mapping[str, str]], Awaitable[str | ResultPage]]


async def _operate(request: Request, operation: Operation) -> Response:
    """A state-changing form post: session, CSRF token and the ``operate`` scope required;
    ``operation`` returns where to go next (a 303 redirect) or a ``ResultPage`` to show."""
    services = services_of(request)
    found = await session_principal(services.config, request)
    form = await read_form(request)
    if found is None:
        return forbidden(request, "no session: open the page (and log in) first")
    session, principal = found
    if not csrf_matches(
        services.config, session, form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    ):
        return forbidden(request, "the form's CSRF token is missing or stale: reload the page")
    if not principal.allows("operate"):
        return forbidden(request, f"token {principal.name!r} lacks the 'operate' scope")

    def message(status_code: int, title: str, text: str) -> Response:
        return html(
            request,
            "message.html",
            session=session,
            principal=principal,
            status_code=status_code,
            title=title,
            message=text,
        )

    try:
        db = await services.store.get()
        target = await operation(db, principal, form)
    except (TaskNotFound, ScheduleNotFound, NotificationNotFound) as exc:
        return message(404, "Not found", str(exc))
    except TaskValidationError as exc:
        return message(422, "Not done", str(exc))
    except TaskNotRetryable as exc:
        return message(409, "Not retryable", str(exc))
    except TaskIdempotencyConflict as exc:
        return message(409, "Not done", str(exc))
    except StoreError:
        response = message(503, "Store unavailable", "the store is unavailable; try again")
        response.headers["Retry-After"] = str(services.config.retry_after_s)
        return response
    if isinstance(target, ResultPage):
        return html(
            request,
            target.template,
            session=session,
            principal=principal,
            status_code=target.status_code,
            **target.context,
        )
    return secure(RedirectResponse(target, status_code=303))


def _ref(value: str) -> str:
    if "\x00" in value or len(value) > 255:
        raise TaskNotFound(value[:255])
    return value


@router.post("/tasks/{task_id}/cancel")
async def cancel_from_page(request: Request, task_id: str) -> Response:
    """Cancel from the task's page. The form's idempotency key is drawn when the page is
    rendered, so a double submit cancels once; the actor is the session's token name."""

    async def cancel(db: StateDB, principal: Principal, form: Mapping[str, str]) -> str:
        key = (form.get("idempotency_key") or "").strip() or f"ui:{uuid.uuid4()}"
        reason = (form.get("reason") or "").strip()[:1000] or "cancelled from the dashboard"
        result = await request_task_cancel(
            db, _ref(task_id), actor=principal.actor(), idempotency_key=key, reason=reason
        )
        return views.task_href(task_id) + f"?cancel={quote(result.state)}"

    return await _operate(request, cancel)


def _form_key(form: Mapping[str, str], generated: str) -> str:
    """The form's idempotency key (drawn when the page was rendered), else ``generated``."""
    return check_key("idempotency_key", (form.get("idempotency_key") or "").strip() or generated)


@router.post("/tasks/{task_id}/retry")
async def retry_from_page(request: Request, task_id: str) -> Response:
    """Retry an ended task from its page (R19) and go to the new task. The form's key is drawn
    when the page is rendered, so a double submit admits one new task; the actor is the
    session's token name. A task that has not ended is a 409 page; nothing is written."""
    services = services_of(request)

    async def retry(db: StateDB, principal: Principal, form: Mapping[str, str]) -> str:
        new_id = await retry_task(
            db,
            _ref(task_id),
            actor=principal.actor(),
            idempotency_key=_form_key(form, f"ui:{uuid.uuid4()}"),
            registry=services.registry,
        )
        return views.task_href(new_id)

    return await _operate(request, retry)


def _bulk_ids(text: str) -> list[str]:
    """The ids a list page showed (whitespace-separated), each once, at most a page of them."""
    ids = list(dict.fromkeys(_ref(part) for part in text.split()))
    if len(ids) > views.PAGE_SIZE:
        raise TaskValidationError(
            "task_ids", f"{len(ids)} ids", f"at most {views.PAGE_SIZE} (one page of the list)"
        )
    return ids


@router.post("/tasks/bulk-retry")
async def bulk_retry(request: Request) -> Response:
    """Retry every task a filtered list page showed (R19), each with the form's one key, so the
    new task of ``T`` is ``retry:T:<key>`` and posting the same form again admits nothing new.
    A task that has not ended is skipped and counted, as is an id not found; the result page
    lists each new task."""
    services = services_of(request)

    async def retry_all(db: StateDB, principal: Principal, form: Mapping[str, str]) -> ResultPage:
        key = _form_key(form, f"ui:bulk:{uuid.uuid4()}")
        retried: list[tuple[str, str]] = []
        not_ended: list[tuple[str, str]] = []
        missing: list[str] = []
        refused: list[tuple[str, str]] = []
        for task_id in _bulk_ids(form.get("task_ids") or ""):
            try:
                new_id = await retry_task(
                    db,
                    task_id,
                    actor=principal.actor(),
                    idempotency_key=key,
                    registry=services.registry,
                )
            except TaskNotRetryable as exc:
                not_ended.append((task_id, exc.status))
            except TaskNotFound:
                missing.append(task_id)
            except (TaskValidationError, TaskIdempotencyConflict) as exc:
                refused.append((task_id, str(exc)))
            else:
                retried.append((task_id, new_id))
        return ResultPage(
            "retried.html",
            {
                "key": key,
                "retried": [(views.task_href(o), o, views.task_href(n), n) for o, n in retried],
                "not_ended": [(views.task_href(t), t, s) for t, s in not_ended],
                "missing": missing,
                "refused": [(views.task_href(t), t, why) for t, why in refused],
                "back": safe_next(form.get("next") or "/tasks"),
            },
        )

    return await _operate(request, retry_all)


@router.post("/schedules/{schedule_id}/{action}")
async def schedule_action(request: Request, schedule_id: str, action: str) -> Response:
    """Fire now (a fresh ``manual:`` key, R13), enable or disable a schedule."""
    services = services_of(request)
    if action not in {"fire", "enable", "disable"}:
        return forbidden(request, f"unknown schedule action {action!r}")

    async def run(db: StateDB, _principal: Principal, form: Mapping[str, str]) -> str:
        row = await get_schedule(db, _ref(schedule_id))
        if action == "fire":
            task_id = await fire_schedule(db, row["id"], registry=services.registry)
            return views.task_href(task_id)
        await (enable_schedule if action == "enable" else disable_schedule)(db, row["id"])
        return "/schedules"

    return await _operate(request, run)


@router.post("/outbox/{notification_id}/retry")
async def outbox_retry(request: Request, notification_id: str) -> Response:
    """Operator retry of a dead_letter or expired notification (R12)."""

    async def run(db: StateDB, _principal: Principal, form: Mapping[str, str]) -> str:
        await retry_notification(db, _ref(notification_id))
        return "/outbox"

    return await _operate(request, run)


@router.post("/workers/{worker_id}/prune")
async def prune_worker_from_page(request: Request, worker_id: str) -> Response:
    """Remove a stopped or stale worker's row (issue 28): ``heartbeat.prune_workers`` for this
    one worker, so a live one, or one holding a live lease, is refused."""
    ttl = services_of(request).config.heartbeat_ttl_s

    async def run(db: StateDB, _principal: Principal, form: Mapping[str, str]) -> str:
        ref = _ref(worker_id)
        if not await prune_workers(db, older_than_s=0, heartbeat_ttl=ttl, worker_id=ref):
            raise TaskValidationError(
                "worker_id", ref, "a stopped or stale worker that holds no live lease"
            )
        return "/workers"

    return await _operate(request, run)


# -- limits and pauses (R20) -------------------------------------------------------------------

LIMIT_FIELDS: Final = ("limit_key", "max_running", "rate", "period_s")


def _form_int(form: Mapping[str, str], name: str) -> int | None:
    """A whole number from the form, or None when blank; the library checks its range."""
    text = (form.get(name) or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise TaskValidationError(name, text, "a whole number, or blank for none") from None


def _form_period_s(form: Mapping[str, str]) -> float | None:
    """The rate's period: seconds, or ``30s``, ``5m``, ``2h``, ``1d`` (as ``taskward limit set
    --per`` reads it); None when blank. The library checks its range."""
    text = (form.get("period_s") or "").strip()
    if not text:
        return None
    return parse_duration("period_s", text)


def _limits_done(done: str, key: str) -> str:
    return "/limits?" + urlencode({"done": done, "key": key})


async def _limits_refused(
    request: Request,
    db: StateDB,
    exc: TaskValidationError,
    form: Mapping[str, str],
    *,
    chosen: str | None,
) -> ResultPage:
    """The limits page again, answering 422: the error names the field (its input is marked)
    and the set form keeps what was typed. Nothing was stored."""
    regions, _ = await pages.limits_view(db, services_of(request), can_operate=True, chosen=chosen)
    return ResultPage(
        "limits.html",
        {
            "regions": regions,
            "data_url": pages.limits_data_url(chosen),
            "form": {name: form.get(name) or "" for name in LIMIT_FIELDS},
            "error": {"field": exc.field, "message": str(exc)},
            "flash": None,
        },
        status_code=422,
    )


@router.post("/limits/set")
async def limit_set(request: Request) -> Response:
    """Set a key's limit (``set_limit``, replacing the one it had); the actor is the session's
    token name. Bad input is the page again with the field's error; nothing is stored."""

    async def run(db: StateDB, principal: Principal, form: Mapping[str, str]) -> str | ResultPage:
        key = (form.get("limit_key") or "").strip()
        try:
            await set_limit(
                db,
                key,
                max_running=_form_int(form, "max_running"),
                rate=_form_int(form, "rate"),
                period_s=_form_period_s(form),
                actor=principal.actor(),
            )
        except TaskValidationError as exc:
            return await _limits_refused(request, db, exc, form, chosen=None)
        return _limits_done("set", key)

    return await _operate(request, run)


@router.post("/limits/clear")
async def limit_clear(request: Request) -> Response:
    """Remove a key's limit (``clear_limit``)."""

    async def run(db: StateDB, _principal: Principal, form: Mapping[str, str]) -> str | ResultPage:
        key = (form.get("limit_key") or "").strip()
        try:
            removed = await clear_limit(db, key)
        except TaskValidationError as exc:
            return await _limits_refused(request, db, exc, {}, chosen=None)
        return _limits_done("cleared" if removed else "no-limit", key)

    return await _operate(request, run)


@router.post("/limits/{action}")
async def kind_pause_or_resume(request: Request, action: str) -> Response:
    """Pause a kind (``pause_kind``: max_running 0 on ``kind:<kind>``) or lift its pause
    (``resume_kind``); the actor is the session's token name."""
    if action not in {"pause", "resume"}:
        return forbidden(request, f"unknown limits action {action!r}")

    async def run(db: StateDB, principal: Principal, form: Mapping[str, str]) -> str | ResultPage:
        kind = (form.get("kind") or "").strip()
        try:
            if action == "pause":
                row = await pause_kind(db, kind, actor=principal.actor())
                return _limits_done("paused", str(row["limit_key"]))
            resumed = await resume_kind(db, kind, actor=principal.actor())
        except TaskValidationError as exc:
            return await _limits_refused(request, db, exc, {}, chosen=None)
        return _limits_done("resumed" if resumed else "not-paused", f"kind:{kind}")

    return await _operate(request, run)


@router.get("/login")
async def login_page(request: Request) -> Response:
    services = services_of(request)
    if not services.config.auth_required:
        return secure(RedirectResponse("/", status_code=303))
    return html(
        request,
        "login.html",
        session=None,
        principal=None,
        next=safe_next(request.query_params.get("next")),
        error=None,
    )


@router.post("/login")
async def login(request: Request) -> Response:
    services = services_of(request)
    form = await read_form(request)
    target = safe_next(form.get("next"))
    if not services.config.auth_required:
        return secure(RedirectResponse(target, status_code=303))
    client = client_of(request)
    wait = services.auth_limiter.retry_after(client)
    if wait is not None:  # checked before the token: a correct one must not tell a guesser
        response = html(
            request,
            "login.html",
            session=None,
            principal=None,
            status_code=429,
            next=target,
            error=f"too many failed logins from this address: try again in {wait} s",
            retry_after_s=wait,
        )
        response.headers["Retry-After"] = str(wait)
        return response
    token = find_token(services.config, (form.get("token") or "").strip())
    if token is None:
        services.auth_limiter.failed(client)
        return html(
            request,
            "login.html",
            session=None,
            principal=None,
            status_code=401,
            next=target,
            error="that token is not valid",
        )
    response = secure(RedirectResponse(target, status_code=303))
    set_session_cookie(services.config, response, new_session(services.config, token.name))
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Clear the cookie and revoke the session in the store, so a saved copy of the cookie is
    refused too. If the store cannot record that, the cookie is kept and the answer is 503:
    the user learns the logout did not happen and can retry."""
    services = services_of(request)
    try:
        found = await session_principal(services.config, request)
        form = await read_form(request)
        if found is not None and not csrf_matches(services.config, found[0], form.get(CSRF_FIELD)):
            return forbidden(request, "the form's CSRF token is missing or stale: reload the page")
        if found is not None and services.config.auth_required:
            await revoke_session(await services.store.get(), found[0])
    except StoreError:
        response = html(
            request,
            "message.html",
            session=None,
            principal=None,
            status_code=503,
            title="Store unavailable",
            message="the store is unavailable, so the session is not logged out; try again",
        )
        response.headers["Retry-After"] = str(services.config.retry_after_s)
        return response
    response = secure(RedirectResponse("/login" if services.config.auth_required else "/", 303))
    clear_session_cookie(services.config, response)
    return response


# For the form posts beside this module (``bulkactions``): the same checks and answers.
operate = _operate
bulk_ids = _bulk_ids
form_key = _form_key
