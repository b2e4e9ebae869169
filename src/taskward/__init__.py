"""taskward: a durable task control plane for Python.

One typed, idempotent admission function; one table of runs with a closed nine-state lifecycle
owned by one compare-and-swap transition function; leased workers that route by capability.

Importing ``taskward`` imports none of the modules below: each public name is imported from its
module on first use (PEP 562), so a worker, the CLI or an application that only submits loads
the modules it uses (issue 27: a worker's start-up is mostly imports; docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskward.adapters import AdapterConfig, TaskContext, build_registry
    from taskward.admission import submit_task, submit_task_sync, submit_tasks
    from taskward.cancellation import cancel_task, request_task_cancel
    from taskward.capabilities import (
        CAPABILITY_CLASSES,
        affinity_score,
        host_scoped_concurrency_key,
        worker_can_serve,
    )
    from taskward.client import SyncClient
    from taskward.dependencies import task_dependencies
    from taskward.errors import (
        AdapterNotRegistered,
        InvalidTransition,
        StoreError,
        StoreUnavailable,
        TaskIdempotencyConflict,
        TaskNotCompleted,
        TaskNotFound,
        TaskNotRetryable,
        TaskValidationError,
        TaskwardError,
        TransitionIdempotencyConflict,
    )
    from taskward.handles import TaskFunction, task
    from taskward.lifecycle import EDGES, TERMINAL, Status
    from taskward.models import (
        Actor,
        CancelResult,
        StateReason,
        TaskApplication,
        TransitionRequest,
        TransitionResult,
    )
    from taskward.reads import get_task, list_task_events, list_tasks, list_transitions
    from taskward.registry import (
        Backoff,
        CancellationToken,
        KindRetryPolicy,
        TaskAdapter,
        TaskAdapterRegistry,
        TaskExecutionResult,
    )
    from taskward.resubmit import retry_task
    from taskward.results import get_task_result
    from taskward.store import StateDB, open_db
    from taskward.transitions import transition_task
    from taskward.worker import (
        claim_and_execute,
        reap_expired_leases,
        register_heartbeat,
        worker_tick,
    )
    from taskward.workflows import Step, Workflow

# Each public name and the module that defines it.
_MODULE_OF: dict[str, str] = {
    "Actor": "taskward.models",
    "AdapterConfig": "taskward.adapters",
    "AdapterNotRegistered": "taskward.errors",
    "Backoff": "taskward.registry",
    "CAPABILITY_CLASSES": "taskward.capabilities",
    "CancelResult": "taskward.models",
    "CancellationToken": "taskward.registry",
    "EDGES": "taskward.lifecycle",
    "InvalidTransition": "taskward.errors",
    "KindRetryPolicy": "taskward.registry",
    "StateDB": "taskward.store",
    "StateReason": "taskward.models",
    "Status": "taskward.lifecycle",
    "Step": "taskward.workflows",
    "StoreError": "taskward.errors",
    "StoreUnavailable": "taskward.errors",
    "SyncClient": "taskward.client",
    "TERMINAL": "taskward.lifecycle",
    "TaskAdapter": "taskward.registry",
    "TaskAdapterRegistry": "taskward.registry",
    "TaskApplication": "taskward.models",
    "TaskContext": "taskward.adapters",
    "TaskExecutionResult": "taskward.registry",
    "TaskFunction": "taskward.handles",
    "TaskIdempotencyConflict": "taskward.errors",
    "TaskNotCompleted": "taskward.errors",
    "TaskNotFound": "taskward.errors",
    "TaskNotRetryable": "taskward.errors",
    "TaskValidationError": "taskward.errors",
    "TaskwardError": "taskward.errors",
    "TransitionIdempotencyConflict": "taskward.errors",
    "TransitionRequest": "taskward.models",
    "TransitionResult": "taskward.models",
    "Workflow": "taskward.workflows",
    "affinity_score": "taskward.capabilities",
    "build_registry": "taskward.adapters",
    "cancel_task": "taskward.cancellation",
    "claim_and_execute": "taskward.worker",
    "get_task": "taskward.reads",
    "get_task_result": "taskward.results",
    "host_scoped_concurrency_key": "taskward.capabilities",
    "list_task_events": "taskward.reads",
    "list_tasks": "taskward.reads",
    "list_transitions": "taskward.reads",
    "open_db": "taskward.store",
    "reap_expired_leases": "taskward.worker",
    "register_heartbeat": "taskward.worker",
    "request_task_cancel": "taskward.cancellation",
    "retry_task": "taskward.resubmit",
    "submit_task": "taskward.admission",
    "submit_task_sync": "taskward.admission",
    "submit_tasks": "taskward.admission",
    "task": "taskward.handles",
    "task_dependencies": "taskward.dependencies",
    "transition_task": "taskward.transitions",
    "worker_can_serve": "taskward.capabilities",
    "worker_tick": "taskward.worker",
}

__all__ = [
    "CAPABILITY_CLASSES",
    "EDGES",
    "TERMINAL",
    "Actor",
    "AdapterConfig",
    "AdapterNotRegistered",
    "Backoff",
    "CancelResult",
    "CancellationToken",
    "InvalidTransition",
    "KindRetryPolicy",
    "StateDB",
    "StateReason",
    "Status",
    "Step",
    "StoreError",
    "StoreUnavailable",
    "SyncClient",
    "TaskAdapter",
    "TaskAdapterRegistry",
    "TaskApplication",
    "TaskContext",
    "TaskExecutionResult",
    "TaskFunction",
    "TaskIdempotencyConflict",
    "TaskNotCompleted",
    "TaskNotFound",
    "TaskNotRetryable",
    "TaskValidationError",
    "TaskwardError",
    "TransitionIdempotencyConflict",
    "TransitionRequest",
    "TransitionResult",
    "Workflow",
    "affinity_score",
    "build_registry",
    "cancel_task",
    "claim_and_execute",
    "get_task",
    "get_task_result",
    "host_scoped_concurrency_key",
    "list_task_events",
    "list_tasks",
    "list_transitions",
    "open_db",
    "reap_expired_leases",
    "register_heartbeat",
    "request_task_cancel",
    "submit_task",
    "submit_task_sync",
    "retry_task",
    "submit_tasks",
    "task",
    "task_dependencies",
    "transition_task",
    "worker_can_serve",
    "worker_tick",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'taskward' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])
