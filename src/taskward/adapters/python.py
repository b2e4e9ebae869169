"""``python``: call an allowlisted ``module:function`` with JSON keyword arguments.

Functions decorated with ``@taskward.task`` register under a kind of their own when their module
is named in the process's imports (``--import`` / ``TASKWARD_IMPORTS``). Sync functions run in a
thread so they never block the worker's event loop.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
import traceback
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, Final, TypeVar

from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult

F = TypeVar("F", bound=Callable[..., Any])
_MARK: Final = "__taskward_task__"
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def task(kind: str | None = None) -> Callable[[F], F]:
    """Mark a function as a task kind of its own (default: the function's name).

    Marking changes no registry: ``build_registry`` registers marked functions of the modules a
    process imports, so what runs is always what that process was configured with.
    """

    def mark(fn: F) -> F:
        setattr(fn, _MARK, kind or fn.__name__)
        return fn

    return mark


async def _call(fn: Callable[..., Any], kwargs: dict[str, Any], token: CancellationToken) -> Any:
    if "cancellation" in inspect.signature(fn).parameters:
        kwargs = {**kwargs, "cancellation": token}
    if inspect.iscoroutinefunction(fn):
        return await fn(**kwargs)
    return await asyncio.to_thread(fn, **kwargs)


async def run_callable(
    fn: Callable[..., Any], kwargs: dict[str, Any], cancellation: CancellationToken
) -> TaskExecutionResult:
    """Run ``fn``: a return is completed (a returned TaskExecutionResult is passed through), an
    exception failed, a cancellation request while running cancelled."""
    job = asyncio.ensure_future(_call(fn, kwargs, cancellation))
    waiter = asyncio.ensure_future(cancellation.wait())
    try:
        await asyncio.wait({job, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not job.done():
        job.cancel()
        try:
            await job
        except asyncio.CancelledError:
            return TaskExecutionResult(status="cancelled", error_detail=cancellation.reason)
        except Exception as exc:
            return TaskExecutionResult(status="cancelled", error_detail=f"{cancellation.reason};"
                                       f" cleanup raised {exc!r}")
    try:
        value = job.result()
    except asyncio.CancelledError:
        return TaskExecutionResult(status="cancelled", error_detail=cancellation.reason)
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return TaskExecutionResult(status="failed", exit_code=1, error_detail=detail[-4000:])
    if isinstance(value, TaskExecutionResult):
        return value
    evidence: list[dict[str, Any]] = []
    if value is not None:
        evidence.append({"kind": "return_value", "repr": repr(value)[:2000]})
    return TaskExecutionResult(status="completed", exit_code=0, evidence_refs=evidence)


def _kwargs(args: dict[str, Any]) -> dict[str, Any]:
    kwargs = args.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise TaskValidationError("args.kwargs", kwargs, "a JSON object of keyword arguments")
    return kwargs


class PythonFunctionAdapter:
    """One ``@taskward.task`` function under its own kind; args are its keyword arguments."""

    def __init__(self, kind: str, fn: Callable[..., Any]) -> None:
        self.action_kind = kind
        self.fn = fn

    def validate_args(self, args: dict[str, Any]) -> None:
        try:
            inspect.signature(self.fn).bind(**{k: v for k, v in args.items()
                                               if k not in {"objective", "cwd"}})
        except TypeError as exc:
            raise TaskValidationError("args", sorted(args), f"the parameters of {self.action_kind}",
                                      message=f"args do not fit {self.action_kind}: {exc}") from exc

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        args = {k: v for k, v in (task.get("action_args") or {}).items()
                if k not in {"objective", "cwd"}}
        return await run_callable(self.fn, args, cancellation)


def task_functions(modules: Iterable[ModuleType]) -> dict[str, PythonFunctionAdapter]:
    found: dict[str, PythonFunctionAdapter] = {}
    for module in modules:
        for value in vars(module).values():
            kind = getattr(value, _MARK, None)
            if isinstance(kind, str) and callable(value):
                found[kind] = PythonFunctionAdapter(kind, value)
    return found


class PythonAdapter:
    """``args.function`` = ``module:function``, ``args.kwargs`` = JSON keyword arguments."""

    action_kind = "python"

    def __init__(
        self,
        *,
        modules: Iterable[str] | None = (),
        functions: dict[str, PythonFunctionAdapter] | None = None,
    ) -> None:
        self.modules = None if modules is None else frozenset(modules)
        self._registered = {
            f"{a.fn.__module__}:{a.fn.__name__}" for a in (functions or {}).values()
        }

    def _allowed(self, target: str) -> bool:
        module = target.split(":", 1)[0]
        return self.modules is None or module in self.modules or target in self._registered

    def validate_args(self, args: dict[str, Any]) -> None:
        target = args.get("function")
        if not isinstance(target, str) or not _TARGET.match(target):
            raise TaskValidationError("args.function", target, "'module:function'")
        if not self._allowed(target):
            allowed = sorted(self.modules or ()) + sorted(self._registered)
            raise TaskValidationError(
                "args.function", target, allowed or "none (set TASKWARD_PYTHON_MODULES)",
                message=(f"args.function {target!r} is not allowlisted; allowed modules and "
                         f"functions: {', '.join(allowed) or 'none (set TASKWARD_PYTHON_MODULES)'}"),
            )
        _kwargs(args)

    def resolve(self, target: str) -> Callable[..., Any]:
        module_name, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(module_name), attr)
        if not callable(fn):
            raise TypeError(f"{target} is not callable")
        return fn  # type: ignore[no-any-return]

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        args = task.get("action_args") or {}
        target = args.get("function", "")
        if not self._allowed(target):
            return TaskExecutionResult(status="failed",
                                       error_detail=f"{target!r} is not allowlisted on this worker")
        try:
            fn = self.resolve(target)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            return TaskExecutionResult(status="failed", error_detail=f"cannot load {target}: {exc}")
        return await run_callable(fn, dict(_kwargs(args)), cancellation)
