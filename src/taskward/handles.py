"""Typed task handles (issue 29): ``@taskward.task`` functions that submit themselves.

``taskward.task`` marks a function as a task kind (``adapters.python.task``: the function is
returned unchanged, so calling it still runs it here) and gives it three methods:

- ``fn.application(key=..., **kwargs)``: the ``TaskApplication`` of a call, its arguments
  validated by the parameters' type hints with pydantic and turned into JSON values
  (``adapters.typed``; a wrong type is a ``TaskValidationError`` naming ``args.<name>``);
- ``await fn.submit(db, key=..., **kwargs)``: that application admitted (``submit_task``), into a
  store or the caller's own open transaction (R24);
- ``fn.submit_sync(target, key=..., **kwargs)``: the same from code without an event loop, into
  a ``SyncClient`` or a synchronous connection's transaction (``submit_task_sync``).

``key`` is the idempotency key (required, as everywhere: the same key and arguments return the
same task); it is the one name a handle reserves, so a task with a parameter named ``key``
builds its ``TaskApplication`` itself. The handle's registry is the function's own module (built
once a module), so a handle needs no configuration; the worker must import that module too
(``TASKWARD_IMPORTS``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from taskward.adapters import AdapterConfig, build_registry
from taskward.adapters.python import task as mark_task
from taskward.adapters.python import task_kind, worker_parameters
from taskward.adapters.typed import as_json
from taskward.admission import submit_task, submit_task_sync
from taskward.client import SyncClient
from taskward.models import TaskApplication
from taskward.registry import Backoff, TaskAdapterRegistry

P = ParamSpec("P")
R = TypeVar("R", covariant=True)


class TaskFunction(Protocol[P, R]):
    """A ``@taskward.task`` function: call it to run it here, or submit it."""

    __name__: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def application(self, *, key: str, **kwargs: Any) -> TaskApplication: ...

    async def submit(self, db: Any, /, *, key: str, **kwargs: Any) -> str: ...

    def submit_sync(self, target: Any, /, *, key: str, **kwargs: Any) -> str: ...


@cache
def _registry(module: str) -> TaskAdapterRegistry:
    return build_registry(AdapterConfig(imports=(module,)))


def _application(fn: Callable[..., Any], *, key: str, **kwargs: Any) -> TaskApplication:
    kind = task_kind(fn)
    assert kind is not None
    args = as_json(fn, kwargs, skipped=worker_parameters(fn), kind=kind)
    return TaskApplication(
        action_kind=kind, args=args, execution_target="host", idempotency_key=key
    )


async def _submit(fn: Callable[..., Any], db: Any, /, *, key: str, **kwargs: Any) -> str:
    app = _application(fn, key=key, **kwargs)
    return await submit_task(db, app, registry=_registry(fn.__module__))


def _submit_sync(fn: Callable[..., Any], target: Any, /, *, key: str, **kwargs: Any) -> str:
    app = _application(fn, key=key, **kwargs)
    registry = _registry(fn.__module__)
    if isinstance(target, SyncClient):
        return target.submit_task(app, registry=registry)
    return submit_task_sync(target, app, registry=registry)


def _handle(fn: Callable[..., Any]) -> Any:
    fn.application = partial(_application, fn)  # type: ignore[attr-defined]
    fn.submit = partial(_submit, fn)  # type: ignore[attr-defined]
    fn.submit_sync = partial(_submit_sync, fn)  # type: ignore[attr-defined]
    return fn


@overload
def task(target: Callable[P, R], /) -> TaskFunction[P, R]: ...


@overload
def task(
    target: str | None = None,
    /,
    *,
    kind: str | None = None,
    max_attempts: int | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    backoff: Backoff | None = None,
) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...


def task(
    target: Any = None,
    /,
    *,
    kind: str | None = None,
    max_attempts: int | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    backoff: Backoff | None = None,
) -> Any:
    """``adapters.python.task`` (the kind, its retry policy: see there), and the function's
    handle methods (see the module's docstring)."""
    marked = mark_task(
        target, kind=kind, max_attempts=max_attempts, retry_on=retry_on, backoff=backoff
    )
    if callable(target):
        return _handle(marked)
    return lambda fn: _handle(marked(fn))


__all__ = ["TaskFunction", "task"]
