"""``TaskContext``: what a task function may ask the worker for besides its JSON args (R22).

A function declares a parameter annotated ``taskward.TaskContext``; the ``python`` adapters
pass one when (and only when) it does, so a function without it pays nothing, not even the
read of its dependencies' results. The parameter is never one of the task's JSON args:
admission refuses a value for it, as it does for ``cancellation``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskward.registry import CancellationToken


@dataclass(frozen=True, slots=True)
class TaskContext:
    """The running attempt of a task, as its function sees it (R22).

    ``task_id``: the task's id; ``attempt``: this attempt's number (the lease's, from 1);
    ``deadline``: when this attempt's deadline is reached (epoch seconds, R5), None when the
    worker gave none; ``cancellation``: the cooperative cancellation token
    (``token.is_cancelled``), the same one a ``cancellation`` parameter receives;
    ``dependency_results``: each dependency's id (R21 ``depends_on``) and its stored result
    (None when it returned None); empty when the task has no dependencies.
    """

    task_id: str
    attempt: int
    deadline: float | None
    cancellation: CancellationToken
    dependency_results: Mapping[str, Any]
