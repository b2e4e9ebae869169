"""The adapter seam (ADR-0072 D4): what an adapter is, and the registry a deployment builds.

Each process builds its registry explicitly (``taskward.adapters.build_registry``); there is no
module-level registry that an import could change behind a caller's back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, runtime_checkable

from taskward.errors import AdapterNotRegistered, TaskValidationError

# `playbook` is accepted at the boundary and becomes `play` before hashing (R8).
DEFAULT_ALIASES: Mapping[str, str] = {"playbook": "play"}

# The largest ``args.timeout_s`` admission accepts, for every kind (R5: a claim sets
# ``deadline_at = now + timeout_s``, so an unbounded value is a deadline no timestamp can hold).
# Configurable per deployment (``TASKWARD_MAX_TASK_TIMEOUT_S``), never above the ceiling, which
# is also the longest deadline a claim ever grants (claims.MAX_TASK_TIMEOUT_SECONDS clamps a row
# stored before this bound with the same value).
DEFAULT_MAX_TASK_TIMEOUT_S: Final = 7 * 24 * 3600.0
MAX_TASK_TIMEOUT_CEILING_S: Final = 366 * 24 * 3600.0


def check_max_task_timeout(field_name: str, value: object) -> float:
    """A deployment's maximum task timeout: seconds in (0, ``MAX_TASK_TIMEOUT_CEILING_S``]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_TASK_TIMEOUT_CEILING_S
    ):
        raise TaskValidationError(
            field_name,
            value,
            f"a number of seconds > 0 and <= {MAX_TASK_TIMEOUT_CEILING_S:.0f} (366 days)",
        )
    return float(value)


@dataclass(frozen=True)
class TaskExecutionResult:
    """What an adapter reports; the worker turns it into one guarded terminal transition."""

    status: Literal["completed", "failed", "timed_out", "cancelled"]
    exit_code: int | None = None
    error_detail: str | None = None
    invocation_id: str | None = None
    evidence_refs: list[dict[str, Any]] = field(default_factory=list)
    # A failure the retry policy may retry (an infrastructure hiccup, a deadline); a plain
    # non-zero exit is not retryable (ADR-0071 D4).
    retryable: bool = False


class CancellationToken:
    """A cooperative cancellation request forwarded from the store to a running adapter."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._callbacks: list[Callable[[], None]] = []
        self.reason: str | None = None

    @property
    def is_cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancel requested") -> None:
        """Request cancellation; idempotent (the first reason is kept)."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once when cancellation is requested (at once if it already was);
        returns a function that unregisters it. No task per waiter, unlike ``wait()``."""
        if self._event.is_set():
            callback()
            return lambda: None
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    async def wait(self) -> None:
        await self._event.wait()


@runtime_checkable
class TaskAdapter(Protocol):
    """Executes one action kind. Adapters never change a task's status themselves."""

    action_kind: str

    def validate_args(self, args: dict[str, Any]) -> None:
        """Raise TaskValidationError (a ValueError) naming the field when args cannot run."""
        ...

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult: ...


class TaskAdapterRegistry:
    """Action kind -> adapter, plus input aliases normalised before admission hashes, plus
    the deployment's ``max_task_timeout_s`` (the largest ``args.timeout_s`` admission accepts
    for any kind; default ``DEFAULT_MAX_TASK_TIMEOUT_S``, 7 days)."""

    def __init__(
        self,
        adapters: Iterable[TaskAdapter] = (),
        *,
        aliases: Mapping[str, str] | None = None,
        max_task_timeout_s: float = DEFAULT_MAX_TASK_TIMEOUT_S,
    ) -> None:
        self._adapters: dict[str, TaskAdapter] = {}
        self._aliases: dict[str, str] = dict(DEFAULT_ALIASES if aliases is None else aliases)
        self.max_task_timeout_s = check_max_task_timeout("max_task_timeout_s", max_task_timeout_s)
        for adapter in adapters:
            self.register(adapter)

    def register(self, adapter: TaskAdapter) -> None:
        kind = adapter.action_kind
        if not isinstance(kind, str) or not kind or any(c.isspace() for c in kind):
            raise TaskValidationError("action_kind", kind, "a non-empty string without spaces")
        if kind in self._aliases:
            raise TaskValidationError(
                "action_kind",
                kind,
                "a name that is not an alias",
                message=(f"action_kind {kind!r} is an alias of {self._aliases[kind]!r}"),
            )
        if kind in self._adapters and self._adapters[kind] is not adapter:
            raise TaskValidationError(
                "action_kind",
                kind,
                "a kind not yet registered",
                message=f"action_kind {kind!r} is already registered",
            )
        self._adapters[kind] = adapter

    def get(self, action_kind: str) -> TaskAdapter | None:
        return self._adapters.get(self._aliases.get(action_kind, action_kind))

    def kinds(self) -> list[str]:
        return sorted(self._adapters)

    @property
    def aliases(self) -> dict[str, str]:
        return {a: c for a, c in self._aliases.items() if c in self._adapters}

    def __contains__(self, action_kind: object) -> bool:
        return isinstance(action_kind, str) and self.get(action_kind) is not None

    def resolve(self, action_kind: object) -> tuple[str, TaskAdapter]:
        """Canonical kind and adapter, or AdapterNotRegistered listing kinds and aliases."""
        if isinstance(action_kind, str):
            canonical = self._aliases.get(action_kind, action_kind)
            adapter = self._adapters.get(canonical)
            if adapter is not None:
                return canonical, adapter
        raise AdapterNotRegistered(action_kind, self._adapters, self.aliases)
