"""The adapter seam (ADR-0072 D4): what an adapter is, and the registry a deployment builds.

Each process builds its registry explicitly (``taskward.adapters.build_registry``); there is no
module-level registry that an import could change behind a caller's back. The registry also
answers a kind's own retry policy (R18: ``KindRetryPolicy``, set by ``@taskward.task``), which
admission, the worker's acknowledgements and the lease reaper ask for by kind.
"""

from __future__ import annotations

import asyncio
import math
import random
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


# R18: a task's attempt ceiling, when a kind or an application sets one, is 1..100.
MAX_ATTEMPTS_LIMIT: Final = 100


@dataclass(frozen=True)
class Backoff:
    """taskward's one backoff policy: a task's retries (the worker's default and a kind's own,
    R18), the outbox's delivery attempts (R12) and the waits of a loop whose store is away
    (``store.retry.outage_backoff``) are all this.

    When a retryable failure's retry is due (ADR-0072 D5): attempt ``n`` waits
    ``min(cap_s, base_s * factor ** (n - 1))`` seconds, scaled by a uniform draw in
    ``[1 - jitter, 1 + jitter]``. The worker's default (``taskward worker --retry-base``) is one;
    a kind may set its own (``@taskward.task(backoff=...)``, R18), checked by ``check``.

    Building one checks nothing: a worker's default may be zero (a retry due at once)."""

    base_s: float = 2.0
    factor: float = 2.0
    cap_s: float = 300.0
    jitter: float = 0.2

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``attempt``-th failure (attempt 1: about ``base_s``)."""
        try:
            raw = min(self.cap_s, self.base_s * self.factor ** max(0, attempt - 1))
        except OverflowError:  # a huge attempt number: the cap
            raw = self.cap_s
        return max(0.0, raw * (1.0 + self.jitter * (2.0 * rng() - 1.0)))

    def check(self, field_name: str = "backoff") -> Backoff:
        """This backoff, if a kind may use it (R18): ``base_s > 0``, ``factor >= 1``,
        ``base_s <= cap_s`` and ``0 <= jitter <= 1``, all finite numbers.

        Raises:
            TaskValidationError: naming ``<field_name>.<field>`` and its allowed range.
        """
        bounds: tuple[tuple[str, object, Callable[[float], bool], str], ...] = (
            ("base_s", self.base_s, lambda v: v > 0, "a finite number of seconds > 0"),
            ("factor", self.factor, lambda v: v >= 1, "a finite number >= 1"),
            (
                "cap_s",
                self.cap_s,
                lambda v: v >= self.base_s,
                f"a finite number of seconds >= base_s ({self.base_s!r})",
            ),
            ("jitter", self.jitter, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        )
        for name, value, ok, allowed in bounds:
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not ok(value)
            ):
                raise TaskValidationError(f"{field_name}.{name}", value, allowed)
        return self


def _is_exception_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


@dataclass(frozen=True)
class KindRetryPolicy:
    """A kind's own retry policy (R18), checked when it is built: ``max_attempts`` (1..100) is
    the ceiling admission stores on a row of the kind when the application gives none;
    ``retry_on``: the exceptions of the kind's function that are retryable (any other fails at
    once, as a non-zero exit does; None: none is, today's rule); ``backoff``: when a retry of
    the kind is due (None: the worker's default). None everywhere is no policy of its own.

    Raises:
        TaskValidationError: a field out of its range, naming it and the range.
    """

    max_attempts: int | None = None
    retry_on: tuple[type[BaseException], ...] | None = None
    backoff: Backoff | None = None

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if attempts is not None and (
            isinstance(attempts, bool)
            or not isinstance(attempts, int)
            or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT
        ):
            raise TaskValidationError(
                "max_attempts", attempts, f"an integer from 1 to {MAX_ATTEMPTS_LIMIT}, or None"
            )
        retry_on = self.retry_on
        if retry_on is not None and (
            not isinstance(retry_on, tuple)
            or not retry_on
            or not all(_is_exception_class(c) for c in retry_on)
        ):
            raise TaskValidationError(
                "retry_on",
                retry_on,
                "a non-empty tuple of exception classes, e.g. (ValueError,), or None",
            )
        if self.backoff is not None:
            if not isinstance(self.backoff, Backoff):
                raise TaskValidationError(
                    "backoff", self.backoff, "a taskward.Backoff(base_s, factor, cap_s, jitter)"
                )
            self.backoff.check("backoff")

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by the kind's function, is retryable: an instance of one of
        ``retry_on`` (no ``retry_on``: never, as before R18)."""
        return self.retry_on is not None and isinstance(exc, self.retry_on)

    @property
    def is_empty(self) -> bool:
        """Nothing set: the worker's and the queue's defaults apply throughout."""
        return self.max_attempts is None and self.retry_on is None and self.backoff is None


# The reason codes an adapter may give a failure of its own (``TaskExecutionResult.
# failure_code``): R22's return value that cannot be stored.
ADAPTER_FAILURE_CODES: Final = frozenset({"result_not_serializable"})


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
    # R22: a completed function's return value as its exact JSON text (None: nothing to store,
    # the function returned None or the kind has no return value); the completing transition
    # writes it to task_results in its own transaction.
    result: str | None = None
    # A failure's reason code when it is more precise than ``execution_failed``: one of
    # ``ADAPTER_FAILURE_CODES`` (any other value is not a reason and is ignored).
    failure_code: str | None = None


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
    for any kind; default ``DEFAULT_MAX_TASK_TIMEOUT_S``, 7 days).

    An adapter may carry a ``retry_policy`` attribute (a ``KindRetryPolicy``: the
    ``@taskward.task`` kinds do); the registry answers it per kind (``retry_policy_for``). An
    adapter without one (``command``, ``python``, the launchers) has none: the queue's ceiling
    and the worker's backoff apply."""

    def __init__(
        self,
        adapters: Iterable[TaskAdapter] = (),
        *,
        aliases: Mapping[str, str] | None = None,
        max_task_timeout_s: float = DEFAULT_MAX_TASK_TIMEOUT_S,
    ) -> None:
        self._adapters: dict[str, TaskAdapter] = {}
        self._policies: dict[str, KindRetryPolicy] = {}
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
        policy = getattr(adapter, "retry_policy", None)
        if isinstance(policy, KindRetryPolicy) and not policy.is_empty:
            self._policies[kind] = policy

    def get(self, action_kind: str) -> TaskAdapter | None:
        return self._adapters.get(self._aliases.get(action_kind, action_kind))

    def kinds(self) -> list[str]:
        return sorted(self._adapters)

    def retry_policy_for(self, action_kind: str) -> KindRetryPolicy | None:
        """The kind's own retry policy (R18), or None: a kind that sets none, a kind of an
        adapter without one, or a kind not registered here (aliases resolve)."""
        return self._policies.get(self._aliases.get(action_kind, action_kind))

    def max_attempts_for(self, action_kind: str) -> int | None:
        """The kind's default attempt ceiling (R18), which admission stores on a row of the
        kind whose application gives none; None: the queue's ceiling (R6)."""
        policy = self.retry_policy_for(action_kind)
        return policy.max_attempts if policy is not None else None

    def backoff_for(self, action_kind: str) -> Backoff | None:
        """The kind's own backoff (R18); None: the worker's default applies."""
        policy = self.retry_policy_for(action_kind)
        return policy.backoff if policy is not None else None

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
