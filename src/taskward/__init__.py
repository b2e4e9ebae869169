"""taskward: a durable task control plane for Python.

One typed, idempotent admission function; one table of runs with a closed nine-state lifecycle
owned by one compare-and-swap transition function; leased workers that route by capability.
"""

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
from taskward.worker import claim_and_execute, reap_expired_leases, register_heartbeat, worker_tick
from taskward.workflows import Step, Workflow

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
