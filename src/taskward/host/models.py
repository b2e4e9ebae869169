"""ADR-0037 D1 payloads, exactly as recorded: frozen, extra-forbidding pydantic models."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class HostModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
