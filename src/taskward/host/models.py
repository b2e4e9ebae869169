"""ADR-0037 D1 payloads, exactly as recorded: frozen, extra-forbidding pydantic models."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from taskward.models import constructed


class HostModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def _non_empty(value: str, field: str) -> str:
    if not value.strip():
        raise ValueError(f"{field} must be non-empty after stripping")
    return value


def _utc(value: datetime, field: str) -> datetime:
    # A naive datetime is invalid rather than interpreted in local time (D1).
    if value.tzinfo is None or value.utcoffset() != timedelta(0):
        raise ValueError(f"{field} must be a timezone-aware UTC datetime")
    return value


class Task(HostModel):
    id: str
    objective: str
    cwd: Path
    lease_id: str
    lease_expires_at: datetime
    attempt: int = Field(ge=1)
    deadline: datetime

    @field_validator("id", "objective", "lease_id")
    @classmethod
    def _strings(cls, value: str, info: Any) -> str:
        return _non_empty(value, info.field_name)

    @field_validator("lease_expires_at", "deadline")
    @classmethod
    def _aware(cls, value: datetime, info: Any) -> datetime:
        return _utc(value, info.field_name)

    @model_validator(mode="after")
    def _lease_covers_deadline(self) -> Task:
        # Protocol v1 has no renewal: a lease shorter than the deadline is an invalid claim.
        if self.deadline > self.lease_expires_at:
            raise ValueError("deadline must be <= lease_expires_at")
        return self


def checked_task(
    *,
    id: str,
    objective: str,
    cwd: Path,
    lease_id: str,
    lease_expires_at: datetime,
    attempt: int,
    deadline: datetime,
) -> Task:
    """``Task(...)`` for a claimed run, each of its validators' checks made here directly (a
    claim hands the host one per task, and the model's validation showed in a worker's CPU:
    measured, docs/benchmarks.md#figures-that-justified-design-choices).
    Values that fail a check, or are not of their field's exact type, go through ``Task`` and
    raise as it does. The instance is built as ``model_construct`` builds one, without its
    per-field loop; a unit test holds it equal to the validated model, field by field."""
    if (
        type(id) is str
        and type(objective) is str
        and type(lease_id) is str
        and type(attempt) is int
        and attempt >= 1
        and isinstance(cwd, Path)
        and type(lease_expires_at) is datetime
        and type(deadline) is datetime
        and id.strip()
        and objective.strip()
        and lease_id.strip()
        and lease_expires_at.utcoffset() == _ZERO
        and deadline.utcoffset() == _ZERO
        and deadline <= lease_expires_at
    ):
        values = {
            "id": id,
            "objective": objective,
            "cwd": cwd,
            "lease_id": lease_id,
            "lease_expires_at": lease_expires_at,
            "attempt": attempt,
            "deadline": deadline,
        }
        return constructed(Task, values, values)
    return Task(
        id=id,
        objective=objective,
        cwd=cwd,
        lease_id=lease_id,
        lease_expires_at=lease_expires_at,
        attempt=attempt,
        deadline=deadline,
    )


_ZERO: Final = timedelta(0)


class TaskResult(HostModel):
    run_id: str
    status: Literal["completed"]
    summary_ref: str


class TaskFailure(HostModel):
    code: Literal[
        "invalid_task",
        "flow_failed",
        "cancelled",
        "deadline",
        "summary_failed",
        "escalation_give_up",
    ]
    detail: str
    retryable: bool


class TaskAck(HostModel):
    applied: bool
    rejection: Literal["missing_holder", "stale_lease", "attempt_ceiling"] | None = None


class SessionSummary(HostModel):
    facts: dict[str, Any]
    narrative: str | None
    manifest_ref: str


def summary_facts(
    task_id: str,
    attempt: int,
    started: datetime,
    ended: datetime,
    elapsed_ms: float,
    output: Mapping[str, Any],
) -> dict[str, Any]:
    """The host-authored facts of a run's summary (ADR-0037 D4), written by the resident host
    and by the ADR-0071 worker functions alike: who ran (the run id is ``<task-id>:<attempt>``,
    R10), when, and what the run reported (``output``: its operation statuses, artifact refs,
    usage and degradation). ``host.summaries.HOST_FACT_KEYS`` names these keys."""
    return {
        "task_id": task_id,
        "attempt": attempt,
        "run_id": f"{task_id}:{attempt}",
        "started_at": started.isoformat(),
        "ended_at": ended.isoformat(),
        "elapsed_ms": round(elapsed_ms, 3),
        "operation_statuses": dict(output.get("operation_statuses", {})),
        "artifact_refs": list(output.get("artifact_refs", [])),
        "usage": dict(output.get("usage", {})),
        "degraded": bool(output.get("degraded", False)),
        "degrade_reason": str(output.get("degrade_reason", "")),
    }


def manifest_ref(task_id: str, attempt: int) -> str:
    """A reference that resolves to the run's row and its transition facts (D4)."""
    return f"taskward:schedule_runs/{task_id}?attempt={attempt}"
