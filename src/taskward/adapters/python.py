"""``python``: call an allowlisted ``module:function`` with JSON keyword arguments.

Functions decorated with ``@taskward.task`` register under a kind of their own when their module
is named in the process's imports (``--import`` / ``TASKWARD_IMPORTS``); marking a function
changes no registry. Sync functions run in a thread so they never block the worker's event loop.

A kind's retry policy (R18: ``max_attempts``, ``retry_on``, ``backoff``) is the kind's, not the
function's: the same function called through ``python`` as ``module:function`` runs without it
(an exception there fails at once, as before R18).

Cancellation: an async function is cancelled (``asyncio.CancelledError`` at its await point). A
sync function cannot be interrupted: it runs to its end and sees the request only through the
``cancellation`` token it may accept (``token.is_cancelled``); the result is ``cancelled`` once
it returns, because a request is not a stop (ADR-0072 D5).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import re
import traceback
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, Final, TypeVar, overload

from taskward.adapters.process import task_args
from taskward.errors import TaskValidationError
from taskward.registry import Backoff, CancellationToken, KindRetryPolicy, TaskExecutionResult

F = TypeVar("F", bound=Callable[..., Any])
_MARK: Final = "__taskward_task__"
_POLICY_MARK: Final = "__taskward_retry_policy__"
# Matched with ``fullmatch`` only: ``match`` with ``$`` also accepts a trailing newline
# (``"json:dumps\n"``), which no worker can resolve and every log line would carry.
_TARGET: Final = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
_KIND: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
# Keys of a task's args that the worker maps onto the host task (R10) or reads for its deadline
# (R5); a decorated function receives them only if it declares a parameter of that name.
_HOST_KEYS: Final = frozenset({"objective", "cwd", "timeout_s"})
_TOKEN_PARAM: Final = "cancellation"
_DETAIL_CHARS: Final = 4000


@overload
def task(target: F, /) -> F: ...


@overload
def task(
    target: str | None = None,
    /,
    *,
    kind: str | None = None,
    max_attempts: int | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    backoff: Backoff | None = None,
) -> Callable[[F], F]: ...


def task(
    target: Any = None,
    /,
    *,
    kind: str | None = None,
    max_attempts: int | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    backoff: Backoff | None = None,
) -> Any:
    """Mark a function as a task kind of its own (default: the function's name).

    ``@task``, ``@task()``, ``@task("kind")`` and ``@task(kind="kind")`` all work. Marking sets
    an attribute on the function and changes no registry: ``build_registry`` registers the
    marked functions of the modules a process imports, so what runs is always what that process
    was configured with.

    The kind's retry policy (R18): ``max_attempts`` (1..100) is its default attempt ceiling,
    stored on a row at admission when the application gives none; ``retry_on``: the exceptions
    that are retryable (``retry_wait`` while attempts remain); any other fails at once, as a
    non-zero exit does (without ``retry_on`` every exception does, as before); ``backoff``
    (``taskward.Backoff``): when the kind's retries are due, instead of the worker's default.

    Raises:
        TaskValidationError: the kind is not a non-empty name without spaces, or a retry
            setting is out of its range (naming the field and the range).
    """
    policy = KindRetryPolicy(max_attempts=max_attempts, retry_on=retry_on, backoff=backoff)
    if callable(target):
        return _mark(target, kind, policy)
    if target is not None and kind is not None:
        raise TypeError("give the kind once: @task('name') or @task(kind='name')")
    chosen = target if target is not None else kind

    def decorate(fn: F) -> F:
        return _mark(fn, chosen, policy)

    return decorate


def _mark(fn: F, kind: object, policy: KindRetryPolicy) -> F:
    name = fn.__name__ if kind is None else kind
    if not isinstance(name, str) or not _KIND.fullmatch(name):
        raise TaskValidationError(
            "kind", name, "a non-empty name of letters, digits, '_', '.', ':' or '-'"
        )
    setattr(fn, _MARK, name)
    setattr(fn, _POLICY_MARK, None if policy.is_empty else policy)
    return fn


def task_kind(fn: object) -> str | None:
    """The kind a function was marked with by ``@task``, if any."""
    kind = getattr(fn, _MARK, None)
    return kind if isinstance(kind, str) else None


def task_retry_policy(fn: object) -> KindRetryPolicy | None:
    """The retry policy ``@task`` gave a function's kind (R18), if it set any."""
    policy = getattr(fn, _POLICY_MARK, None)
    return policy if isinstance(policy, KindRetryPolicy) else None


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


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return _cached_signature(fn)
    except TypeError:  # unhashable callable object
        return _read_signature(fn)


def _parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter] | None:
    signature = _signature(fn)
    return signature.parameters if signature is not None else None


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    params = _parameters(fn)
    return params is not None and name in params


class _FunctionExited(Exception):
    """A task function raised SystemExit; asyncio would let it end the worker's event loop."""


async def _call(fn: Callable[..., Any], kwargs: dict[str, Any], token: CancellationToken) -> Any:
    if _accepts(fn, _TOKEN_PARAM):
        kwargs = {**kwargs, _TOKEN_PARAM: token}
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


def _error(exc: BaseException) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(exc, _FunctionExited) and exc.__cause__ is not None:
        exc = exc.__cause__
    detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return detail[-_DETAIL_CHARS:], [{"kind": "traceback", "text": trace[-_DETAIL_CHARS:]}]


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
) -> TaskExecutionResult:
    """Run ``fn`` with ``kwargs`` (and the token, if it takes ``cancellation``).

    A return is completed (a returned TaskExecutionResult passes through as is), an exception
    failed — retryable only when ``policy`` has ``retry_on`` and it is one of them (R18) — a
    cancellation requested while it ran cancelled.
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
        detail, error_evidence = _error(exc)
        if policy is not None and policy.retry_on is not None:
            return _judged(exc, detail, error_evidence, policy)
        return TaskExecutionResult(
            status="failed", exit_code=1, error_detail=detail, evidence_refs=error_evidence
        )
    evidence: list[dict[str, Any]] = []
    if value is not None:
        try:
            text = repr(value)
        except Exception as repr_error:
            text = f"<{type(value).__name__}: repr raised {repr_error!r}>"
        evidence.append({"kind": "return_value", "repr": text[:_DETAIL_CHARS]})
    return TaskExecutionResult(status="completed", exit_code=0, evidence_refs=evidence)


# Keyword-name sets that bound, per function; bounded (a few sets per function, few functions).
_BOUND: dict[Callable[..., Any], set[frozenset[str]]] = {}
_BOUND_NAME_SETS: Final = 64
_BOUND_FUNCTIONS: Final = 512


def _remember_bound(fn: Callable[..., Any], names: frozenset[str]) -> None:
    try:
        known = _BOUND.get(fn)
        if known is None:
            if len(_BOUND) >= _BOUND_FUNCTIONS:
                _BOUND.clear()
            known = _BOUND[fn] = set()
    except TypeError:  # unhashable callable object
        return
    if len(known) >= _BOUND_NAME_SETS:
        known.clear()
    known.add(names)


def _check_bind(fn: Callable[..., Any], kwargs: dict[str, Any], field: str, kind: str) -> None:
    if _TOKEN_PARAM in kwargs and _accepts(fn, _TOKEN_PARAM):
        raise TaskValidationError(
            f"{field}.{_TOKEN_PARAM}",
            kwargs[_TOKEN_PARAM],
            "not given: the worker passes the token",
        )
    params = _parameters(fn)
    if params is None:
        return
    # Whether keyword arguments bind depends only on their names: a name set that bound once
    # binds again (a bulk admission of one kind checks each application's names at once).
    names = frozenset(kwargs)
    try:
        if names in _BOUND.get(fn, ()):
            return
    except TypeError:  # unhashable callable object: no cache
        pass
    probe = dict(kwargs)
    if _TOKEN_PARAM in params:
        probe[_TOKEN_PARAM] = None
    try:
        signature = _signature(fn)
        assert signature is not None
        signature.bind(**probe)
        _remember_bound(fn, names)
    except TypeError as exc:
        allowed = [n for n in params if n != _TOKEN_PARAM]
        raise TaskValidationError(
            field,
            sorted(kwargs),
            allowed,
            message=f"{field} do not fit {kind}: {exc}; parameters: {', '.join(allowed)}",
        ) from exc


class PythonFunctionAdapter:
    """One ``@taskward.task`` function under its own kind; ``args`` are its keyword arguments.

    ``objective``, ``cwd`` and ``timeout_s`` in args belong to the worker (R5, R10) and reach the
    function only if it declares a parameter of that name. ``retry_policy``: the kind's (R18),
    what ``@task`` gave the function unless given here; the registry answers it per kind.
    """

    def __init__(
        self, kind: str, fn: Callable[..., Any], retry_policy: KindRetryPolicy | None = None
    ) -> None:
        self.action_kind = kind
        self.fn = fn
        self.target = f"{fn.__module__}:{fn.__name__}"
        self.retry_policy = retry_policy if retry_policy is not None else task_retry_policy(fn)

    def kwargs(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in args.items() if k not in _HOST_KEYS or _accepts(self.fn, k)}

    def validate_args(self, args: dict[str, Any]) -> None:
        _check_bind(self.fn, self.kwargs(args), "args", self.action_kind)

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        try:
            kwargs = self.kwargs(task_args(task))
            _check_bind(self.fn, kwargs, "args", self.action_kind)
        except TaskValidationError as exc:
            return TaskExecutionResult(status="failed", error_detail=str(exc))
        return await run_callable(self.fn, kwargs, cancellation, policy=self.retry_policy)


def task_functions(modules: Iterable[ModuleType]) -> dict[str, PythonFunctionAdapter]:
    """The ``@task`` functions of ``modules`` by kind.

    Raises:
        TaskValidationError: two different functions claim the same kind.
    """
    found: dict[str, PythonFunctionAdapter] = {}
    for module in modules:
        for value in list(vars(module).values()):
            kind = task_kind(value)
            if kind is None or not callable(value):
                continue
            existing = found.get(kind)
            if existing is not None and existing.fn is not value:
                raise TaskValidationError(
                    "kind",
                    kind,
                    "one function per kind",
                    message=(
                        f"task kind {kind!r} is claimed by both {existing.target} and "
                        f"{value.__module__}:{value.__name__}"
                    ),
                )
            found[kind] = PythonFunctionAdapter(kind, value)
    return found


def _kwargs(args: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = args.get("kwargs", {})
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise TaskValidationError("args.kwargs", kwargs, "a JSON object of keyword arguments")
    return kwargs


class PythonAdapter:
    """``args.function`` = ``module:function``, ``args.kwargs`` = JSON keyword arguments.

    ``modules``: modules whose own functions may be called (exact names; a package does not
    allow its submodules; None allows any). A callable a listed module merely imports from
    elsewhere is refused, as are dunder names. ``functions``: the ``@task`` functions of the
    process's imports, callable here as ``module:function`` too.
    """

    action_kind = "python"

    def __init__(
        self,
        *,
        modules: Iterable[str] | None = (),
        functions: Mapping[str, PythonFunctionAdapter] | None = None,
    ) -> None:
        if isinstance(modules, str):
            raise TypeError("modules must be an iterable of module names, not one string")
        self.modules = None if modules is None else frozenset(modules)
        self._registered = {a.target: a for a in (functions or {}).values()}

    def _allowed(self, target: str) -> bool:
        module = target.split(":", 1)[0]
        return self.modules is None or module in self.modules or target in self._registered

    def validate_args(self, args: dict[str, Any]) -> None:
        target = args.get("function")
        if not isinstance(target, str) or not _TARGET.fullmatch(target):
            raise TaskValidationError("args.function", target, "'module:function'")
        if target.endswith("__") and target.rpartition(":")[2].startswith("__"):
            raise TaskValidationError("args.function", target, "a function that is not a dunder")
        if not self._allowed(target):
            allowed = sorted(self.modules or ()) + sorted(self._registered)
            allowed_text = ", ".join(allowed) or "none (set TASKWARD_PYTHON_MODULES)"
            raise TaskValidationError(
                "args.function",
                target,
                allowed or "none (set TASKWARD_PYTHON_MODULES)",
                message=(
                    f"args.function {target!r} is not allowlisted; "
                    f"allowed modules and functions: {allowed_text}"
                ),
            )
        kwargs = _kwargs(args)
        registered = self._registered.get(target)
        if registered is not None:
            _check_bind(registered.fn, kwargs, "args.kwargs", target)
        elif _TOKEN_PARAM in kwargs:
            raise TaskValidationError(
                f"args.kwargs.{_TOKEN_PARAM}", kwargs[_TOKEN_PARAM], "not given (reserved)"
            )

    def resolve(self, target: str) -> Callable[..., Any]:
        """The callable ``target`` names (imports its module).

        Raises:
            ImportError, AttributeError: it does not exist.
            TypeError: it is not callable, or is not defined in an allowlisted module.
        """
        registered = self._registered.get(target)
        if registered is not None:
            return registered.fn
        module_name, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(module_name), attr)
        if not callable(fn):
            raise TypeError(f"{target} is not callable")
        if self.modules is not None and getattr(fn, "__module__", None) != module_name:
            raise TypeError(
                f"{target} is defined in {getattr(fn, '__module__', None)!r}, "
                f"not in the allowlisted module {module_name!r}"
            )
        return fn  # type: ignore[no-any-return]

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        # Checked again here: this worker's allowlist may be narrower than the admitting one's.
        try:
            args = task_args(task)
            self.validate_args(args)
        except TaskValidationError as exc:
            return TaskExecutionResult(
                status="failed", error_detail=f"rejected by this worker's python adapter: {exc}"
            )
        target: str = args["function"]
        try:
            fn = self.resolve(target)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            return TaskExecutionResult(status="failed", error_detail=f"cannot load {target}: {exc}")
        except Exception as exc:  # the module raised while importing
            detail, evidence = _error(exc)
            return TaskExecutionResult(
                status="failed",
                error_detail=f"cannot load {target}: {detail}",
                evidence_refs=evidence,
            )
        return await run_callable(fn, dict(_kwargs(args)), cancellation)
