"""``python``: call an allowlisted ``module:function`` with JSON keyword arguments.

Functions decorated with ``@taskward.task`` register under a kind of their own when their module
is named in the process's imports (``--import`` / ``TASKWARD_IMPORTS``); marking a function
changes no registry. Sync functions run in a thread so they never block the worker's event loop.

A kind's retry policy (R18: ``max_attempts``, ``retry_on``, ``backoff``) is the kind's, not the
function's: the same function called through ``python`` as ``module:function`` runs without it
(an exception there fails at once, as before R18).

A return value is stored as JSON with the completion, and a parameter annotated
``taskward.TaskContext`` receives the running attempt's context (R22: ``calling``, ``context``).

Cancellation: an async function is cancelled (``asyncio.CancelledError`` at its await point). A
sync function cannot be interrupted: it runs to its end and sees the request only through the
``cancellation`` token it may accept (``token.is_cancelled``); the result is ``cancelled`` once
it returns, because a request is not a stop (ADR-0072 D5).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, Final, TypeVar, overload

from taskward.adapters.calling import (
    DEFAULT_MAX_RESULT_BYTES,
    TOKEN_PARAM,
    accepts,
    context_parameter,
    error_of,
    parameters,
    run_callable,
    signature,
)
from taskward.adapters.context import TaskContext
from taskward.adapters.process import task_args
from taskward.adapters.typed import json_schema, validated
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


def worker_parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The parameters of ``fn`` the worker fills, never the task's JSON args: the cancellation
    token and the task context (R22)."""
    context = context_parameter(fn)
    token = (TOKEN_PARAM,) if accepts(fn, TOKEN_PARAM) else ()
    return token if context is None else (*token, context)


def _check_bind(fn: Callable[..., Any], kwargs: dict[str, Any], field: str, kind: str) -> None:
    params = parameters(fn)
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
    filled = worker_parameters(fn)
    for name in filled:
        if name in kwargs:
            what = "the token" if name == TOKEN_PARAM else "the task context (R22)"
            raise TaskValidationError(
                f"{field}.{name}", kwargs[name], f"not given: the worker passes {what}"
            )
    probe = dict(kwargs)
    for name in filled:
        probe[name] = None
    try:
        read = signature(fn)
        assert read is not None
        read.bind(**probe)
        _remember_bound(fn, names)
    except TypeError as exc:
        allowed = [n for n in params if n not in filled]
        raise TaskValidationError(
            field,
            sorted(kwargs),
            allowed,
            message=f"{field} do not fit {kind}: {exc}; parameters: {', '.join(allowed)}",
        ) from exc


async def _with_context(
    name: str, kwargs: dict[str, Any], task: Mapping[str, Any], cancellation: CancellationToken
) -> dict[str, Any]:
    """``kwargs`` with the ``TaskContext`` (R22) under ``name``, the function's parameter; the
    dependencies' results are read here (``task["dependency_results"]``, the worker's loader),
    for a function that declares the parameter only."""
    load = task.get("dependency_results")
    results = await load() if load is not None else {}
    context = TaskContext(
        task_id=task["id"],
        attempt=task["attempt"],
        deadline=task.get("deadline_at"),
        cancellation=cancellation,
        dependency_results=results,
    )
    return {**kwargs, name: context}


async def _call_with_context(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    task: Mapping[str, Any],
    cancellation: CancellationToken,
    *,
    context: str | None,
    policy: KindRetryPolicy | None,
    max_result_bytes: int,
) -> TaskExecutionResult:
    """``run_callable``, with the ``TaskContext`` under ``context`` when the function declares
    one (a function without it pays nothing: no read, no context)."""
    if context is not None:
        try:
            kwargs = await _with_context(context, kwargs, task, cancellation)
        except Exception as exc:  # the store could not be read: another attempt may
            return TaskExecutionResult(
                status="failed",
                retryable=True,
                error_detail=f"task context not built: the dependencies' results: {exc!r}",
            )
    return await run_callable(
        fn, kwargs, cancellation, policy=policy, max_result_bytes=max_result_bytes
    )


class PythonFunctionAdapter:
    """One ``@taskward.task`` function under its own kind; ``args`` are its keyword arguments.

    ``objective``, ``cwd`` and ``timeout_s`` in args belong to the worker (R5, R10) and reach the
    function only if it declares a parameter of that name. ``retry_policy``: the kind's (R18),
    what ``@task`` gave the function unless given here; the registry answers it per kind.
    """

    def __init__(
        self,
        kind: str,
        fn: Callable[..., Any],
        retry_policy: KindRetryPolicy | None = None,
        *,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        self.action_kind = kind
        self.fn = fn
        self.max_result_bytes = max_result_bytes
        # R22: the parameter that takes the TaskContext, read once (None: it has none).
        self.context = context_parameter(fn)
        self.target = f"{fn.__module__}:{fn.__name__}"
        self.retry_policy = retry_policy if retry_policy is not None else task_retry_policy(fn)

    def kwargs(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in args.items() if k not in _HOST_KEYS or accepts(self.fn, k)}

    def validate_args(self, args: dict[str, Any]) -> None:
        """The names bind (``_check_bind``) and each typed parameter's value fits its type hint
        (``typed.validated``: a wrong type is a TaskValidationError naming ``args.<name>``)."""
        kwargs = self.kwargs(args)
        _check_bind(self.fn, kwargs, "args", self.action_kind)
        validated(self.fn, kwargs, skipped=worker_parameters(self.fn), kind=self.action_kind)

    def args_schema(self, ref_template: str | None = None) -> dict[str, Any]:
        """The JSON Schema of this kind's arguments (``taskward kinds``, the OpenAPI document,
        whose ``ref_template`` places nested definitions among its components)."""
        return json_schema(self.fn, worker_parameters(self.fn), ref_template=ref_template)

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        try:
            kwargs = self.kwargs(task_args(task))
            _check_bind(self.fn, kwargs, "args", self.action_kind)
            # the admission's check again, just before the call, which gets the converted values
            kwargs = validated(
                self.fn, kwargs, skipped=worker_parameters(self.fn), kind=self.action_kind
            )
        except TaskValidationError as exc:
            return TaskExecutionResult(status="failed", error_detail=str(exc))
        if self.context is None:
            return await run_callable(
                self.fn,
                kwargs,
                cancellation,
                policy=self.retry_policy,
                max_result_bytes=self.max_result_bytes,
            )
        return await _call_with_context(
            self.fn,
            kwargs,
            task,
            cancellation,
            context=self.context,
            policy=self.retry_policy,
            max_result_bytes=self.max_result_bytes,
        )


def task_functions(
    modules: Iterable[ModuleType], *, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
) -> dict[str, PythonFunctionAdapter]:
    """The ``@task`` functions of ``modules`` by kind (``max_result_bytes``: the bound of a
    stored return value, R22).

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
            found[kind] = PythonFunctionAdapter(kind, value, max_result_bytes=max_result_bytes)
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
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        if isinstance(modules, str):
            raise TypeError("modules must be an iterable of module names, not one string")
        self.modules = None if modules is None else frozenset(modules)
        self.max_result_bytes = max_result_bytes
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
        elif TOKEN_PARAM in kwargs:
            raise TaskValidationError(
                f"args.kwargs.{TOKEN_PARAM}", kwargs[TOKEN_PARAM], "not given (reserved)"
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
            detail, evidence = error_of(exc)
            return TaskExecutionResult(
                status="failed",
                error_detail=f"cannot load {target}: {detail}",
                evidence_refs=evidence,
            )
        kwargs = dict(_kwargs(args))
        context = context_parameter(fn)
        if context is not None and context in kwargs:
            return TaskExecutionResult(
                status="failed",
                error_detail=f"args.kwargs.{context} is given, but {target} takes the task "
                "context there (R22): the worker passes it",
            )
        return await _call_with_context(
            fn,
            kwargs,
            task,
            cancellation,
            context=context,
            policy=None,
            max_result_bytes=self.max_result_bytes,
        )
