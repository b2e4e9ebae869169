"""The resident engine host (ADR-0037): models, ports, the host, and the in-tree local source
and summary store over taskward's store."""

from taskward.host.engine_host import ResidentEngineHost
from taskward.host.manifest import resolve_manifest
from taskward.host.models import SessionSummary, Task, TaskAck, TaskFailure, TaskResult
from taskward.host.ports import (
    FinishesInOneStep,
    RenewsLeases,
    SummaryNotWritten,
    SummaryStore,
    TaskRunFailure,
    TaskSource,
)
from taskward.host.runner import AdapterRunner, TaskSession
from taskward.host.source import LocalTaskSource
from taskward.host.summaries import LocalSummaryStore, SummaryConflict

__all__ = [
    "AdapterRunner",
    "FinishesInOneStep",
    "LocalSummaryStore",
    "LocalTaskSource",
    "RenewsLeases",
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
