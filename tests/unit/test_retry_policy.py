"""A kind's retry policy (DESIGN.md R18): what ``@taskward.task`` accepts, what the registry
answers per kind, and how a raise of a kind with ``retry_on`` is judged."""

from __future__ import annotations

import math
from typing import Any

import pytest

import taskward
from taskward import (
    AdapterConfig,
    Backoff,
    CancellationToken,
    KindRetryPolicy,
    TaskAdapterRegistry,
    TaskValidationError,
    build_registry,
)
from taskward.adapters import CommandAdapter, PythonFunctionAdapter
from taskward.adapters.python import run_callable, task_kind, task_retry_policy
from taskward.execution import RetryPolicy
from tests.fixtures import retry_tasks

RETRY = "tests.fixtures.retry_tasks"


def registry() -> TaskAdapterRegistry:
    return build_registry(
        AdapterConfig(imports=(RETRY,), python_modules=frozenset({RETRY}), command_allowlist=None)
    )


# -- validation at decoration time ------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field", "allowed"),
    [
        ({"max_attempts": 0}, "max_attempts", "from 1 to 100"),
        ({"max_attempts": 101}, "max_attempts", "from 1 to 100"),
        ({"max_attempts": True}, "max_attempts", "from 1 to 100"),
        ({"max_attempts": 2.0}, "max_attempts", "from 1 to 100"),
        ({"max_attempts": "3"}, "max_attempts", "from 1 to 100"),
        ({"retry_on": ValueError}, "retry_on", "tuple of exception classes"),
        ({"retry_on": [ValueError]}, "retry_on", "tuple of exception classes"),
        ({"retry_on": ()}, "retry_on", "non-empty tuple"),
        ({"retry_on": ("ValueError",)}, "retry_on", "tuple of exception classes"),
        ({"retry_on": (ValueError, int)}, "retry_on", "tuple of exception classes"),
        ({"retry_on": (ValueError("x"),)}, "retry_on", "tuple of exception classes"),
        ({"backoff": 5.0}, "backoff", "taskward.Backoff"),
        ({"backoff": {"base_s": 1.0}}, "backoff", "taskward.Backoff"),
        ({"backoff": Backoff(base_s=0.0)}, "backoff.base_s", "> 0"),
        ({"backoff": Backoff(base_s=-1.0)}, "backoff.base_s", "> 0"),
        ({"backoff": Backoff(base_s=math.nan)}, "backoff.base_s", "> 0"),
        ({"backoff": Backoff(base_s=True)}, "backoff.base_s", "> 0"),
        ({"backoff": Backoff(factor=0.5)}, "backoff.factor", ">= 1"),
        ({"backoff": Backoff(factor=math.inf)}, "backoff.factor", ">= 1"),
        ({"backoff": Backoff(base_s=10.0, cap_s=5.0)}, "backoff.cap_s", ">= base_s (10.0)"),
        ({"backoff": Backoff(cap_s=math.inf)}, "backoff.cap_s", ">= base_s"),
        ({"backoff": Backoff(jitter=-0.1)}, "backoff.jitter", "[0, 1]"),
        ({"backoff": Backoff(jitter=1.5)}, "backoff.jitter", "[0, 1]"),
        ({"backoff": Backoff(jitter="0.1")}, "backoff.jitter", "[0, 1]"),  # type: ignore[arg-type]
    ],
)
def test_task_decorator_refuses_retry_settings_out_of_range_naming_the_field(
    settings: dict[str, Any], field: str, allowed: str
) -> None:
    def fn() -> None: ...

    with pytest.raises(TaskValidationError) as info:
        taskward.task(kind="checked", **settings)(fn)
    assert info.value.field == field
    assert allowed in info.value.allowed and field in str(info.value)
    assert task_kind(fn) is None and task_retry_policy(fn) is None  # nothing marked


def test_task_decorator_accepts_the_bounds_of_each_range() -> None:
    def low() -> None: ...

    def high() -> None: ...

    edge = Backoff(base_s=0.001, factor=1.0, cap_s=0.001, jitter=0.0)
    taskward.task(max_attempts=1, retry_on=(BaseException,), backoff=edge)(low)
    taskward.task(max_attempts=100, backoff=Backoff(jitter=1.0))(high)
    assert task_retry_policy(low) == KindRetryPolicy(1, (BaseException,), edge)
    policy = task_retry_policy(high)
    assert policy is not None and policy.max_attempts == 100 and policy.retry_on is None


def test_a_kind_without_retry_settings_has_no_policy() -> None:
    def plain() -> None: ...

    def empty() -> None: ...

    taskward.task(plain)
    taskward.task(kind="empty", max_attempts=None, retry_on=None, backoff=None)(empty)
    assert task_retry_policy(plain) is None and task_retry_policy(empty) is None
    assert task_kind(empty) == "empty"


def test_backoff_is_public_and_retry_policy_stays_its_alias() -> None:
    assert taskward.Backoff is RetryPolicy
    assert RetryPolicy() == Backoff(base_s=2.0, factor=2.0, cap_s=300.0, jitter=0.2)
    # A worker's default may retry at once; only a kind's own backoff is range-checked.
    assert RetryPolicy(base_s=0.0, jitter=0.0).delay(3) == 0.0
    delays = [retry_tasks.PICKY_BACKOFF.delay(a) for a in (1, 2, 3, 4, 5)]
    assert delays == [30.0, 90.0, 270.0, 500.0, 500.0]


# -- the registry answers per kind ------------------------------------------------------------


def test_registry_answers_each_kinds_retry_policy_and_max_attempts() -> None:
    reg = registry()
    assert reg.retry_policy_for("picky") == KindRetryPolicy(
        retry_on=(ValueError,), backoff=retry_tasks.PICKY_BACKOFF
    )
    assert reg.max_attempts_for("picky") is None
    assert reg.backoff_for("picky") == retry_tasks.PICKY_BACKOFF
    assert reg.retry_policy_for("patient") == KindRetryPolicy(
        max_attempts=5, backoff=retry_tasks.PATIENT_BACKOFF
    )
    assert reg.max_attempts_for("patient") == 5
    assert reg.backoff_for("picky_default_backoff") is None


@pytest.mark.parametrize("kind", ["bare", "command", "python", "play", "playbook", "nope"])
def test_kinds_without_a_policy_of_their_own_answer_none(kind: str) -> None:
    reg = registry()
    assert reg.retry_policy_for(kind) is None
    assert reg.max_attempts_for(kind) is None
    assert reg.backoff_for(kind) is None


def test_an_alias_answers_its_kinds_policy_and_any_adapter_may_carry_one() -> None:
    policy = KindRetryPolicy(max_attempts=7)

    class Custom(CommandAdapter):
        action_kind = "custom"
        retry_policy = policy

    reg = TaskAdapterRegistry([Custom(allowlist=None)], aliases={"alias": "custom"})
    assert reg.retry_policy_for("alias") is policy and reg.max_attempts_for("custom") == 7


def test_a_function_adapter_built_by_hand_reads_the_functions_policy() -> None:
    adapter = PythonFunctionAdapter("picky", retry_tasks.picky)
    assert adapter.retry_policy == KindRetryPolicy(
        retry_on=(ValueError,), backoff=retry_tasks.PICKY_BACKOFF
    )
    assert PythonFunctionAdapter("plain", retry_tasks._raise).retry_policy is None


# -- a raise, judged by retry_on --------------------------------------------------------------


async def run_kind(kind: str, args: dict[str, Any]) -> taskward.TaskExecutionResult:
    _, adapter = registry().resolve(kind)
    adapter.validate_args(args)
    task = {"id": "t-1", "action_kind": kind, "action_args": args}
    return await adapter.execute(task, cancellation=CancellationToken())


@pytest.mark.parametrize("error", ["ValueError", "Transient"])
async def test_an_exception_in_retry_on_is_a_retryable_failure(error: str) -> None:
    result = await run_kind("picky", {"error": error})
    assert (result.status, result.retryable, result.exit_code) == ("failed", True, 1)
    assert result.error_detail is not None and f"raised {error}" in result.error_detail
    judged = result.evidence_refs[-1]
    expected = "ValueError" if error == "ValueError" else f"{RETRY}.Transient"
    assert judged == {
        "kind": "retry_on",
        "exception": expected,
        "retry_on": ["ValueError"],
        "retryable": True,
    }


async def test_an_exception_outside_retry_on_fails_at_once_naming_its_type() -> None:
    result = await run_kind("picky", {"error": "KeyError"})
    assert (result.status, result.retryable, result.exit_code) == ("failed", False, 1)
    assert result.error_detail == (
        "KeyError: 'raised KeyError' (not retried: KeyError is not in retry_on: ValueError)"
    )
    assert result.evidence_refs[0]["kind"] == "traceback"
    assert result.evidence_refs[-1] == {
        "kind": "retry_on",
        "exception": "KeyError",
        "retry_on": ["ValueError"],
        "retryable": False,
    }


@pytest.mark.parametrize("kind", ["bare", "patient"])
async def test_without_retry_on_an_exception_fails_at_once_as_before(kind: str) -> None:
    result = await run_kind(kind, {"error": "ValueError"})
    assert (result.status, result.retryable, result.exit_code) == ("failed", False, 1)
    assert result.error_detail == "ValueError: raised ValueError"
    assert [ref["kind"] for ref in result.evidence_refs] == ["traceback"]


async def test_the_same_function_through_python_runs_without_the_kinds_policy() -> None:
    args = {"function": f"{RETRY}:picky", "kwargs": {"error": "ValueError"}}
    result = await run_kind("python", args)
    assert (result.status, result.retryable) == ("failed", False)


async def test_run_callable_judges_a_sync_exit_by_its_system_exit() -> None:
    def leave() -> None:
        raise SystemExit(3)

    policy = KindRetryPolicy(retry_on=(SystemExit,))
    result = await run_callable(leave, {}, CancellationToken(), policy=policy)
    assert (result.status, result.retryable) == ("failed", True)
    assert result.evidence_refs[-1]["exception"] == "SystemExit"


def test_the_store_outage_wait_is_the_one_backoff_in_the_upper_half() -> None:
    """``outage_backoff``: a uniform draw in [c/2, c] of c = min(cap, base * factor^(n-1)),
    expressed as the registry's one ``Backoff`` (base and cap x 3/4, jitter 1/3)."""
    from taskward.store.retry import STORE_BACKOFF, outage_backoff

    assert isinstance(STORE_BACKOFF, Backoff)
    policy = outage_backoff(base_s=0.1, cap_s=1.0)
    for failures, ceiling in [(1, 0.1), (2, 0.2), (4, 0.8), (5, 1.0), (10_000, 1.0)]:
        assert policy.delay(failures, lambda: 0.0) == pytest.approx(ceiling / 2)
        assert policy.delay(failures, lambda: 1.0) == pytest.approx(ceiling)
