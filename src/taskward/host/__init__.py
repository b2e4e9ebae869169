"""The resident engine host (ADR-0037): models, ports, the host, and the in-tree local source
and summary store over taskward's store."""

from taskward.host.engine_host import ResidentEngineHost, TaskRunFailure
from taskward.host.local import (
    AdapterRunner,
    LocalSummaryStore,
    LocalTaskSource,
    SummaryConflict,
    TaskSession,
    resolve_manifest,
)
from taskward.host.models import SessionSummary, Task, TaskAck, TaskFailure, TaskResult
from taskward.host.ports import FinishesInOneStep, SummaryNotWritten, SummaryStore, TaskSource

__all__ = [
    "AdapterRunner",
    "FinishesInOneStep",
    "LocalSummaryStore",
    "LocalTaskSource",
    "ResidentEngineHost",
    "SessionSummary",
    "SummaryConflict",
    "SummaryNotWritten",
    "SummaryStore",
    "Task",
    "TaskAck",
    "TaskFailure",
    "TaskResult",
    "TaskRunFailure",
    "TaskSession",
    "TaskSource",
    "resolve_manifest",
]
