"""Calling a task function: its signature (read once), the call itself under cooperative
cancellation, and how its end becomes a ``TaskExecutionResult`` -- an exception judged by the
kind's retry policy (R18), a return value stored as JSON (R22).

R22: a return value other than None is serialised here, once, to the exact JSON text the
completing transition stores (``TaskExecutionResult.result``), bounded by ``max_result_bytes``
(default 1 MiB, ``TASKWARD_MAX_RESULT_BYTES``). A value that ``json`` cannot serialise (a set, an
object, NaN, a lone surrogate, a cycle) or whose JSON is over the bound fails the attempt:
``failed`` with reason ``result_not_serializable``, never retried (running it again returns the
same value), its detail naming the type or the size and the limit. None stores nothing: a
completed task without a stored result reads as None.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import traceback
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

from taskward.adapters.context import TaskContext
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, KindRetryPolicy, TaskExecutionResult

TOKEN_PARAM: Final = "cancellation"
DETAIL_CHARS: Final = 4000

# R22: the largest JSON text of a return value that is stored (bytes of UTF-8), by default and
# at most (a deployment sets its own with TASKWARD_MAX_RESULT_BYTES).
DEFAULT_MAX_RESULT_BYTES: Final = 1024 * 1024
MAX_RESULT_BYTES_CEILING: Final = 64 * 1024 * 1024
RESULT_NOT_SERIALIZABLE: Final = "result_not_serializable"
_RESULT_JSON: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def check_max_result_bytes(field_name: str, value: object) -> int:
    """A deployment's result bound: an integer of bytes in [1, ``MAX_RESULT_BYTES_CEILING``]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_RESULT_BYTES_CEILING
    ):
        raise TaskValidationError(
            field_name, value, f"an integer number of bytes from 1 to {MAX_RESULT_BYTES_CEILING}"
        )
    return value


class ResultNotSerializable(Exception):
    """A return value that cannot be stored (R22); the message says why."""


def encode_result(value: Any, max_bytes: int) -> str:
    """The exact JSON text stored for ``value`` (compact, keys in the order returned, UTF-8, no
    NaN), as ``json.dumps`` serialises it.

    Raises:
        ResultNotSerializable: json refuses it, or its UTF-8 is over ``max_bytes``.
    """
    try:
        text = _RESULT_JSON.encode(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultNotSerializable(
            f"the return value ({type(value).__name__}) is not JSON-serialisable: {exc}"
        ) from None
    if size > max_bytes:
        raise ResultNotSerializable(
            f"the return value ({type(value).__name__}) is {size} bytes of JSON, over the limit "
            f"of {max_bytes} bytes (TASKWARD_MAX_RESULT_BYTES)"
        )
    return text


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def _read_signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


# A task function's signature is read once, not on every run (reading it showed in a no-op
# task's CPU: docs/benchmarks.md#figures-that-justified-design-choices);
# bounded, and unhashable callables are simply read each time.
_cached_signature = functools.lru_cache(maxsize=512)(_read_signature)


def signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return _cached_signature(fn)
    except TypeError:  # unhashable callable object
        return _read_signature(fn)


def parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter] | None:
    read = signature(fn)
    return read.parameters if read is not None else None


def accepts(fn: Callable[..., Any], name: str) -> bool:
    params = parameters(fn)
    return params is not None and name in params


# How a postponed annotation (``from __future__ import annotations``: a string, read as text and
# never evaluated) names the context type, alone or with None.
_CONTEXT_NAMES: Final = frozenset(
    {"TaskContext", "taskward.TaskContext", "taskward.adapters.TaskContext"}
)


def _names_context(text: str) -> bool:
    text = text.replace(" ", "").replace('"', "").replace("'", "")
    for wrapper in ("Optional[", "typing.Optional["):
        if text.startswith(wrapper) and text.endswith("]"):
            text = text[len(wrapper) : -1]
    named = set(text.split("|")) - {"None"}
    return len(named) == 1 and named.pop() in _CONTEXT_NAMES


def _is_context(annotation: object) -> bool:
    if annotation is TaskContext:
        return True
    if isinstance(annotation, str):
        return _names_context(annotation)
    return TaskContext in typing.get_args(annotation)  # TaskContext | None, Optional[...]


def _read_context_parameter(fn: Callable[..., Any]) -> str | None:
    params = parameters(fn)
    if params is None:
        return None
    for name, param in params.items():
        if _is_context(param.annotation):
            return name
    return None


_cached_context_parameter = functools.lru_cache(maxsize=512)(_read_context_parameter)


def context_parameter(fn: Callable[..., Any]) -> str | None:
    """The name of ``fn``'s parameter annotated ``taskward.TaskContext`` (R22), if it has one
    (read once per function, as its signature is)."""
    try:
        return _cached_context_parameter(fn)
    except TypeError:  # unhashable callable object
        return _read_context_parameter(fn)


class _FunctionExited(Exception):
    """A task function raised SystemExit; asyncio would let it end the worker's event loop."""


async def _call(fn: Callable[..., Any], kwargs: dict[str, Any], token: CancellationToken) -> Any:
    if accepts(fn, TOKEN_PARAM):
        kwargs = {**kwargs, TOKEN_PARAM: token}
    try:
        if _is_async(fn):
            return await fn(**kwargs)
        value = await asyncio.to_thread(fn, **kwargs)
        if inspect.isawaitable(value):  # a sync wrapper that hands back a coroutine
            value = await value
        return value
    except SystemExit as exc:
        raise _FunctionExited(exc.code) from exc


def _wake(waiter: asyncio.Future[None], _: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _consume(job: asyncio.Future[Any]) -> None:
    if not job.cancelled():
        job.exception()


def error_of(exc: BaseException) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(exc, _FunctionExited) and exc.__cause__ is not None:
        exc = exc.__cause__
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return detail[-DETAIL_CHARS:], [{"kind": "traceback", "text": trace[-DETAIL_CHARS:]}]


def _type_name(cls: type[BaseException]) -> str:
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _judged(
    exc: BaseException, detail: str, evidence: list[dict[str, Any]], policy: KindRetryPolicy
) -> TaskExecutionResult:
    """A raise of a kind with ``retry_on`` (R18): retryable when the exception is one of them;
    any other fails at once, its detail saying why it was not retried."""
    if isinstance(exc, _FunctionExited) and exc.__cause__ is not None:
        exc = exc.__cause__
    retryable = policy.is_retryable(exc)
    retry_on = [_type_name(c) for c in policy.retry_on or ()]
    evidence = [
        *evidence,
        {
            "kind": "retry_on",
            "exception": _type_name(type(exc)),
            "retry_on": retry_on,
            "retryable": retryable,
        },
    ]
    if not retryable:
        detail += (
            f" (not retried: {_type_name(type(exc))} is not in retry_on: {', '.join(retry_on)})"
        )
    return TaskExecutionResult(
        status="failed",
        exit_code=1,
        error_detail=detail,
        evidence_refs=evidence,
        retryable=retryable,
    )


async def run_callable(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    cancellation: CancellationToken,
    *,
    policy: KindRetryPolicy | None = None,
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
) -> TaskExecutionResult:
    """Run ``fn`` with ``kwargs`` (and the token, if it takes ``cancellation``).

    A return is completed with its value as JSON (R22: ``encode_result``; a value that cannot
    be stored fails with ``result_not_serializable``; a returned TaskExecutionResult passes
    through as is), an exception failed — retryable only when ``policy`` has ``retry_on`` and
    it is one of them (R18) — a cancellation requested while it ran cancelled.
    """
    if cancellation.is_cancelled:
        return TaskExecutionResult(
            status="cancelled", error_detail=f"{cancellation.reason} (before the call)"
        )
    job: asyncio.Future[Any] = asyncio.ensure_future(_call(fn, kwargs, cancellation))

    def stop() -> None:
        # An async function is cancelled at once; a sync one in a thread cannot be stopped:
        # it is waited for, to see the token and end.
        if not job.done() and _is_async(fn):
            job.cancel()

    forget = cancellation.on_cancel(stop)
    # Wait for the job on a future of our own, not on the job itself: cancelling this caller
    # (a host shutdown) must not wait for a function that ignores its cancellation. The same
    # as ``asyncio.wait({job})``, without its sets and bookkeeping (measured:
    # docs/benchmarks.md#figures-that-justified-design-choices).
    done = asyncio.get_running_loop().create_future()
    job.add_done_callback(functools.partial(_wake, done))
    try:
        await done
    except asyncio.CancelledError:
        job.cancel()
        job.add_done_callback(_consume)
        raise
    finally:
        forget()
    # Requested while it ran: the token fired before (or as) the function finished.
    requested = cancellation.is_cancelled

    if job.cancelled():
        if requested:
            return TaskExecutionResult(status="cancelled", error_detail=cancellation.reason)
        return TaskExecutionResult(
            status="failed", error_detail="the function was cancelled without a request"
        )
    exc = job.exception()
    if exc is not None and not isinstance(exc, Exception):
        raise exc
    value = job.result() if exc is None else None
    if isinstance(value, TaskExecutionResult):
        return value
    if requested:
        ended = "returned" if exc is None else f"raised {type(exc).__name__}"
        return TaskExecutionResult(
            status="cancelled", error_detail=f"{cancellation.reason}; the function {ended}"
        )
    if exc is not None:
        detail, error_evidence = error_of(exc)
        if policy is not None and policy.retry_on is not None:
            return _judged(exc, detail, error_evidence, policy)
        return TaskExecutionResult(
            status="failed", exit_code=1, error_detail=detail, evidence_refs=error_evidence
        )
    if value is None:
        return TaskExecutionResult(status="completed", exit_code=0, evidence_refs=[])
    try:
        stored = encode_result(value, max_result_bytes)
    except ResultNotSerializable as exc:
        # R22: the attempt fails, not retried; the fact's summary names the type or the size.
        return TaskExecutionResult(
            status="failed",
            error_detail=str(exc),
            evidence_refs=[{"kind": RESULT_NOT_SERIALIZABLE, "type": type(value).__name__}],
            failure_code=RESULT_NOT_SERIALIZABLE,
        )
    try:
        text = repr(value)
    except Exception as repr_error:
        text = f"<{type(value).__name__}: repr raised {repr_error!r}>"
    return TaskExecutionResult(
        status="completed",
        exit_code=0,
        evidence_refs=[{"kind": "return_value", "repr": text[:DETAIL_CHARS]}],
        result=stored,
    )
