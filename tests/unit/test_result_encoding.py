"""R22's pure parts: what a return value stores (``adapters.calling.encode_result``), how a run
of a function ends with one, and which parameter takes the ``TaskContext``."""

from __future__ import annotations

from typing import Any, Optional

import pytest

import taskward
from taskward.adapters.calling import (
    ResultNotSerializable,
    context_parameter,
    encode_result,
    run_callable,
)
from taskward.execution import Report


def test_a_result_is_compact_json_in_the_order_returned() -> None:
    assert encode_result({"b": 1, "a": [1.5, None, "é"]}, 100) == '{"b":1,"a":[1.5,null,"é"]}'
    assert encode_result((1, 2), 100) == "[1,2]"


@pytest.mark.parametrize(
    "value", [{1, 2}, object(), float("nan"), float("inf"), "\ud800", b"bytes"]
)
def test_values_json_cannot_store_are_refused_naming_their_type(value: Any) -> None:
    with pytest.raises(ResultNotSerializable) as raised:
        encode_result(value, 1000)
    assert f"({type(value).__name__})" in str(raised.value)


def test_the_bound_counts_utf8_bytes() -> None:
    assert encode_result("é" * 4, 10) == '"éééé"'  # 10 bytes
    with pytest.raises(ResultNotSerializable, match="11 bytes of JSON, over the limit of 10"):
        encode_result("é" * 4 + "x", 10)


def test_a_cycle_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ResultNotSerializable):
        encode_result(loop, 1000)


async def test_a_run_carries_the_json_or_fails_with_its_own_reason() -> None:
    token = taskward.CancellationToken()
    done = await run_callable(lambda: {"x": 1}, {}, token)
    assert (done.status, done.result) == ("completed", '{"x":1}')
    empty = await run_callable(lambda: None, {}, token)
    assert (empty.status, empty.result) == ("completed", None)
    bad = await run_callable(lambda: {1}, {}, token)
    assert (bad.status, bad.failure_code, bad.retryable) == (
        "failed",
        "result_not_serializable",
        False,
    )
    assert Report.of(bad).failure_code == "result_not_serializable"
    # a code outside the adapters' own is no reason
    other = taskward.TaskExecutionResult(status="failed", failure_code="operator")
    assert Report.of(other).failure_code is None


def _plain(a: int, ctx: taskward.TaskContext) -> None: ...
def _optional(ctx: Optional[taskward.TaskContext], a: int = 0) -> None: ...  # noqa: UP045
def _union(context: taskward.TaskContext | None) -> None: ...
def _postponed(a: int, c: TaskContext) -> None: ...  # noqa: F821
def _qualified(c: taskward.TaskContext | None) -> None: ...
def _none(a: int, cancellation: Any = None) -> None: ...


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (_plain, "ctx"),
        (_optional, "ctx"),
        (_union, "context"),
        (_postponed, "c"),
        (_qualified, "c"),
        (_none, None),
    ],
)
def test_the_context_parameter_is_found_by_its_annotation(fn: Any, name: str | None) -> None:
    assert context_parameter(fn) == name
