"""Errors as ``application/problem+json`` (RFC 9457): the HTTP binding's one error table.

Bad input is a 4xx naming the field and what is allowed, never a 500 (DESIGN.md "Guarantees").
The table maps the library's typed errors to status codes; first match wins, so subclasses come
before their bases (STYLE.md section 4).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, get_args

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from taskward.errors import (
    AdapterNotRegistered,
    NotificationNotFound,
    NotificationNotRetryable,
    ScheduleNotFound,
    StoreError,
    StoreUnavailable,
    TaskIdempotencyConflict,
    TaskNotCompleted,
    TaskNotFound,
    TaskNotRetryable,
    TaskValidationError,
    TaskwardError,
    TransitionIdempotencyConflict,
)

log = logging.getLogger("taskward.http")

PROBLEM_JSON: Final = "application/problem+json"
_TYPE_PREFIX: Final = "urn:taskward:problem:"
_MAX_VALUE_CHARS: Final = 200
_MAX_LISTED_VALUES: Final = 20
_MAX_DETAIL_CHARS: Final = 2000
_MAX_DEPTH: Final = 8
_MAX_INT_BITS: Final = 1024  # Python refuses to print an int of more than 4300 digits

# (error class, status, problem type slug, title)
ERROR_TABLE: Final[tuple[tuple[type[Exception], int, str, str], ...]] = (
    (NotificationNotRetryable, 409, "not-retryable", "Notification not retryable"),
    (TaskNotRetryable, 409, "not-retryable", "Task not retryable"),
    (TaskNotCompleted, 409, "not-completed", "Task not completed"),
    (AdapterNotRegistered, 422, "invalid-input", "Invalid input"),
    (TaskValidationError, 422, "invalid-input", "Invalid input"),
    (TaskIdempotencyConflict, 409, "idempotency-conflict", "Idempotency key conflict"),
    (TransitionIdempotencyConflict, 409, "idempotency-conflict", "Idempotency key conflict"),
    (TaskNotFound, 404, "not-found", "Not found"),
    (ScheduleNotFound, 404, "not-found", "Not found"),
    (NotificationNotFound, 404, "not-found", "Not found"),
    (StoreUnavailable, 503, "store-unavailable", "Store unavailable"),
    # Any other store failure: the service cannot answer now; the cause is logged.
    (StoreError, 503, "store-unavailable", "Store unavailable"),
)


class ApiProblem(Exception):
    """Raise to answer with a problem document (auth failures, bad headers, 413 ...)."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = dict(headers or {})
        self.extensions = extensions


def problem_response(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    instance: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": _TYPE_PREFIX + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    body.update({k: v for k, v in extensions.items() if v is not None})
    return JSONResponse(
        _encodable(body), status_code=status, headers=dict(headers or {}), media_type=PROBLEM_JSON
    )


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _encodable(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON that always renders: an error response never fails on what it echoes
    (DESIGN.md "Guarantees": bad input is a 4xx, never a 500). A lone surrogate becomes a
    ``\\udXXX`` escape, a non-finite float its name, an integer too long to print its size,
    anything else not JSON its repr; every text is bounded."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return (
            value if value.bit_length() <= _MAX_INT_BITS else f"<int of {value.bit_length()} bits>"
        )
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        text = _bounded(value, _MAX_DETAIL_CHARS)
        return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode()
    if depth < _MAX_DEPTH and isinstance(value, Mapping):
        return {str(_encodable(k, depth + 1)): _encodable(v, depth + 1) for k, v in value.items()}
    if depth < _MAX_DEPTH and isinstance(value, list | tuple):
        return [_encodable(v, depth + 1) for v in value]
    return _encodable(_bounded(_safe_repr(value), _MAX_VALUE_CHARS), depth)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a hostile __repr__ must not turn a 422 into a 500
        return f"<{type(value).__name__}>"


def _shown_value(value: Any) -> Any:
    """The rejected value, if it is small and plain; else a truncated repr. Always encodable
    (``_encodable``): the value may be the very text that was refused for not being UTF-8."""
    if value is None or isinstance(value, bool | int | float):
        return _encodable(value)
    if (
        isinstance(value, list)
        and len(value) <= _MAX_LISTED_VALUES
        and all(isinstance(v, str) and len(v) <= _MAX_VALUE_CHARS for v in value)
    ):
        return _encodable(value)  # a few ids stay a JSON list: R21's missing depends_on ids
    text = value if isinstance(value, str) else _safe_repr(value)
    return _encodable(_bounded(text, _MAX_VALUE_CHARS))


def problem_for_error(exc: TaskwardError, *, instance: str, retry_after_s: int) -> JSONResponse:
    """The problem document of a library error (looked up in ERROR_TABLE)."""
    # A TaskwardError outside the table: an operation the service could not complete.
    status, slug, title = 500, "internal", "Internal error"
    for kind, kind_status, kind_slug, kind_title in ERROR_TABLE:
        if isinstance(exc, kind):
            status, slug, title = kind_status, kind_slug, kind_title
            break
    extensions: dict[str, Any] = {}
    headers: dict[str, str] = {}
    if isinstance(exc, TaskValidationError):
        extensions.update(field=exc.field, value=_shown_value(exc.value), allowed=exc.allowed)
    if isinstance(exc, AdapterNotRegistered):
        extensions.update(registered=exc.registered, aliases=exc.aliases)
    if isinstance(exc, TaskIdempotencyConflict):
        extensions.update(idempotency_key=exc.key, existing_task_id=exc.existing_task_id)
    if isinstance(exc, TaskNotFound):
        extensions.update(task_id=exc.task_id)
    if isinstance(exc, TaskNotCompleted):
        extensions.update(task_id=exc.task_id, task_status=exc.status)
    if isinstance(exc, ScheduleNotFound):
        extensions.update(schedule_ref=exc.schedule_ref)
    if isinstance(exc, NotificationNotFound | NotificationNotRetryable):
        extensions.update(notification_id=exc.notification_id)
    detail = _bounded(" ".join(str(exc).split()), _MAX_DETAIL_CHARS)
    if isinstance(exc, StoreError):
        # A store that is away (an outage answers every request with it) is one line; a store
        # that failed otherwise keeps its traceback for the operator.
        away = isinstance(exc, StoreUnavailable)
        log.warning("store failure answering %s: %r", instance, exc, exc_info=None if away else exc)
        headers["Retry-After"] = str(retry_after_s)
        if not isinstance(exc, StoreUnavailable):
            detail = "the store failed; try again later"
    return problem_response(
        status, slug, title, detail, instance=instance, headers=headers, **extensions
    )


def _field_of(loc: Sequence[Any]) -> str:
    # ("body", "args") -> "args"; ("query", "limit") -> "limit"; ("header", "x") -> "x"
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in {"body", "query", "path", "header", "cookie"}:
        parts = parts[1:]
    return ".".join(parts) or "body"


def _allowed_of(error: Mapping[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        return str(ctx["expected"])
    msg = str(error.get("msg", ""))
    return msg[0].lower() + msg[1:] if msg else "a valid value"


# pydantic's answers to a body that is not an object (FastAPI hands a body it did not decode
# as JSON over as bytes, so a missing Content-Type ends here too).
_NOT_AN_OBJECT: Final = frozenset({"model_attributes_type", "dict_type", "model_type"})
_JSON_TYPES: Final = {
    list: "a JSON array",
    str: "a JSON string",
    bool: "a JSON boolean",
    int: "a JSON number",
    float: "a JSON number",
    type(None): "JSON null",
    bytes: "not JSON",
}


def is_json_media_type(content_type: str | None) -> bool:
    """``application/json`` or a ``+json`` type, as FastAPI decodes them (parameters aside)."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


def _is_body_shape_error(exc: RequestValidationError) -> bool:
    return any(
        tuple(e.get("loc") or ()) == ("body",) and e.get("type") in _NOT_AN_OBJECT
        for e in exc.errors()
    )


def media_type_problem(content_type: str | None, *, instance: str) -> JSONResponse:
    """415: a body sent without ``Content-Type: application/json``, saying what came."""
    got = (
        f"the request's Content-Type is {_encodable(_bounded(content_type, _MAX_VALUE_CHARS))!r}"
        if content_type
        else "the request has no Content-Type header"
    )
    return problem_response(
        415,
        "unsupported-media-type",
        "Unsupported media type",
        f"the body must be a JSON object sent with Content-Type: application/json; {got}",
        instance=instance,
        field="Content-Type",
        allowed="application/json",
    )


def _body_message(error: Mapping[str, Any], body: Any) -> str:
    """pydantic's message, except for a body that is not an object: which JSON it is."""
    if tuple(error.get("loc") or ()) == ("body",) and error.get("type") in _NOT_AN_OBJECT:
        shown = _JSON_TYPES.get(type(body), "not a JSON object")
        return f"the body must be a JSON object, not {shown}"
    return str(error.get("msg", "invalid"))


def validation_problem(
    exc: RequestValidationError,
    *,
    instance: str,
    fields: Sequence[str] | None = None,
) -> JSONResponse:
    """A pydantic request-model error as a 422 problem naming the field and what is allowed.

    ``fields``: the fields the body's model takes, listed for an unknown one (``extra_forbidden``
    errors; also as the ``allowed_fields`` extension). The rejected input is not echoed (it can
    be large or sensitive).
    """
    errors = []
    for e in exc.errors():
        kind = str(e.get("type", "invalid"))
        # A body that is not JSON at all: its loc is a character position, not a field.
        is_json_error = kind == "json_invalid"
        message = _body_message(e, getattr(exc, "body", None))
        allowed = "a JSON object" if is_json_error else _allowed_of(e)
        if kind == "extra_forbidden" and fields:
            listed = ", ".join(fields)
            message = f"unknown field; the fields allowed here are {listed}"
            allowed = f"one of the fields {listed}"
        errors.append(
            {
                "field": "body" if is_json_error else _field_of(e.get("loc", ())),
                "location": str((e.get("loc") or ("body",))[0]),
                "type": kind,
                "message": message,
                "allowed": allowed,
            }
        )
    first = errors[0] if errors else {"field": "body", "message": "invalid", "allowed": "?"}
    detail = f"{first['field']}: {first['message']}"
    if len(errors) > 1:
        detail += f" (and {len(errors) - 1} more)"
    return problem_response(
        422,
        "invalid-input",
        "Invalid input",
        detail,
        instance=instance,
        field=first["field"],
        allowed=first["allowed"],
        allowed_fields=list(fields)
        if fields and any(e["type"] == "extra_forbidden" for e in errors)
        else None,
        errors=errors,
    )


def body_fields(request: Request) -> list[str] | None:
    """The fields the route's body model takes (its deprecated ones left out), or None."""
    field = getattr(request.scope.get("route"), "body_field", None)
    annotation = getattr(getattr(field, "field_info", None), "annotation", None)
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return [
                info.alias or name
                for name, info in candidate.model_fields.items()
                if not info.deprecated
            ]
    return None


def install_problem_handlers(app: FastAPI, *, retry_after_s: int) -> None:
    """Route every error the app can raise through the problem documents above."""

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiProblem)
        return problem_response(
            exc.status,
            exc.slug,
            exc.title,
            exc.detail,
            instance=request.url.path,
            headers=exc.headers,
            **exc.extensions,
        )

    async def on_taskward(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TaskwardError)
        return problem_for_error(exc, instance=request.url.path, retry_after_s=retry_after_s)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        content_type = request.headers.get("content-type")
        if _is_body_shape_error(exc) and not is_json_media_type(content_type):
            return media_type_problem(content_type, instance=request.url.path)
        return validation_problem(exc, instance=request.url.path, fields=body_fields(request))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and request.method in {"POST", "PUT", "PATCH"}:
            # FastAPI's answer to a body it could not decode at all (not UTF-8, nested past
            # the parser's limit): bad input like any other, so a 422 naming the body.
            return problem_response(
                422,
                "invalid-input",
                "Invalid input",
                f"body: {exc.detail}",
                instance=request.url.path,
                field="body",
                allowed="a JSON object in UTF-8",
            )
        slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "HTTP error")
        return problem_response(
            exc.status_code,
            slug,
            title,
            str(exc.detail),
            instance=request.url.path,
            headers=dict(exc.headers or {}),
        )

    app.add_exception_handler(ApiProblem, on_problem)
    app.add_exception_handler(TaskwardError, on_taskward)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
