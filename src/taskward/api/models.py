"""Request and response bodies of the HTTP API (pydantic models; they shape /openapi.json).

Request models only carry values: the library validates them (``submit_task`` names the field
and the allowed values), so a model error and a library error both come back as 422 problems.
Response models allow extra fields: a task is its schedule_runs row, whatever its columns.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from taskward.lifecycle import Status
from taskward.models import EXECUTION_TARGETS
from taskward.reads import ARGS_INLINE_BYTES, ARGS_PREVIEW_CHARS, ELLIPSIS, REDACTED

TARGET_ENUM = sorted(EXECUTION_TARGETS)


def iso_twin(name: str) -> Any:
    """The ``<name>_iso`` field every answer carries beside an epoch time (web/times.py)."""
    return Field(
        default=None,
        description=f"`{name}` as an ISO 8601 UTC time (`2026-12-05T09:31:12.761Z`); null when "
        f"`{name}` is. Every `*_at` and `run_after` field has such a twin.",
    )


STATUS_ENUM = [s.value for s in Status]


class TaskSubmission(BaseModel):
    """A TaskApplication (ADR-0072 D1) as JSON; the key may come in the Idempotency-Key header."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "action_kind": "command",
                    "args": {"argv": ["echo", "hello"]},
                    "execution_target": "host",
                    "idempotency_key": "hello:1",
                }
            ]
        },
    )

    action_kind: str = Field(
        description="A registered adapter kind (command, python, agent, ...); unknown kinds get "
        "a 422 listing the registered ones."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="JSON object of arguments.")
    execution_target: str = Field(
        default="host",
        description="Where the task runs.",
        json_schema_extra={"enum": list[JsonValue](TARGET_ENUM)},
    )
    idempotency_key: str | None = Field(
        default=None,
        description="Same key and same application: the original task (200). Generated "
        "(`http:<uuid4>`) when neither this nor the Idempotency-Key header is given; only a key "
        "you chose makes a retry safe.",
    )
    required_capabilities: list[str] = Field(default_factory=list)
    library_ref: str | None = None
    library_content_hash: str | None = None
    # DESIGN.md R15: strict, so a string or a bool is the library's 422 naming the field, never
    # silently coerced; the ranges are the library's (admission.check_*).
    run_after: float | None = Field(
        default=None,
        strict=True,
        description="R16: epoch seconds before which no worker starts the task.",
    )
    delay_s: float | None = Field(
        default=None,
        strict=True,
        description="R16, a convenience: run_after = now + delay_s. A retry with the same key "
        "keeps the first request's run_after (not both with run_after).",
    )
    priority: int = Field(default=0, strict=True, description="R17: -100..100, higher first.")
    max_attempts: int | None = Field(
        default=None,
        strict=True,
        description="R18: this task's attempt ceiling, 1..100 (default: its kind's, else the "
        "queue's).",
    )
    limit_key: str | None = Field(
        default=None, description="R20: a limit key (tenant:acme) beside kind:<action_kind>."
    )
    depends_on: list[str] = Field(
        default_factory=list,
        strict=True,
        description="R21: ids of existing tasks (at most 1,000) this one runs after: it waits "
        "(`waiting_dependency`) until every one has completed, and is skipped "
        "(`dependency_failed`) when one ends otherwise. An id that does not exist is a 422 "
        "listing it; nothing stored. Sorted and de-duplicated, it joins the application hash.",
    )


class SubmitResult(BaseModel):
    task_id: str
    idempotency_key: str
    key_generated: bool = Field(description="True when the service generated the key.")
    created: bool = Field(description="True: a new task (201); false: the key's existing task.")


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str | None = Field(
        default=None, description="Generated when absent (and not in the header)."
    )
    reason: str = Field(default="", max_length=1000, description="Recorded on the transition.")


class CancelResponse(BaseModel):
    task_id: str
    state: Literal["cancelled", "cancellation_requested", "already_terminal"]
    current_status: str
    idempotency_key: str
    key_generated: bool


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idempotency_key: str | None = Field(
        default=None,
        description="The operator's key (generated when absent and not in the header); the "
        "new task's admission key is retry:<task-id>:<key>.",
    )


class RetryResponse(BaseModel):
    task_id: str = Field(description="The new task.")
    retry_of: str = Field(description="The ended task it runs again (never changed).")
    idempotency_key: str
    key_generated: bool


class Placement(BaseModel):
    model_config = ConfigDict(extra="allow")

    claimable: bool
    reason: str


class _TaskColumns(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    status: str
    action_kind: str
    execution_target: str | None = None
    idempotency_key: str | None = None
    admission_source: str | None = None
    created_at: float
    created_at_iso: str | None = iso_twin("created_at")


ENV_REDACTED = f'`env` values are shown as `"{REDACTED}"` (the names are kept): they are secrets.'


class TaskRow(_TaskColumns):
    """One schedule_runs row (times are epoch seconds); every column is returned."""

    action_args: dict[str, Any] = Field(description=f"The task's args, whole. {ENV_REDACTED}")


class TaskOut(TaskRow):
    """A task's row plus, while it is queued, why it is not running yet (``placement``)."""

    placement: Placement | None = None


class TaskListItem(_TaskColumns):
    """A task in a listing: its row without ``action_args`` (``GET /api/tasks/{id}`` has
    them), with a bounded preview instead, so a page's size does not grow with the args."""

    args_preview: str = Field(
        description=f"The args' canonical JSON cut to {ARGS_PREVIEW_CHARS} characters, then "
        f"`{ELLIPSIS}`. {ENV_REDACTED} Args over {ARGS_INLINE_BYTES} bytes are previewed from "
        "the stored text without `env`."
    )
    args_bytes: int = Field(
        description="Size of the stored args in bytes (their JSON text: canonical on SQLite, "
        "jsonb's text form on PostgreSQL)."
    )


class TaskPage(BaseModel):
    tasks: list[TaskListItem]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


class Transition(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    previous_status: str | None = None
    status: str
    reason_code: str
    reason_summary: str | None = None
    actor: str | None = None
    created_at: float
    created_at_iso: str | None = iso_twin("created_at")


class TransitionList(BaseModel):
    task_id: str
    transitions: list[Transition]


class TaskResultOut(BaseModel):
    """A completed task's stored result (R22): the completing attempt and the decoded JSON
    value (null when the function returned nothing)."""

    task_id: str
    attempt: int
    result: Any = None


class DependencyRow(BaseModel):
    """A task linked to another by R21's ``task_dependencies``, with its state."""

    model_config = ConfigDict(extra="allow")

    id: str
    action_kind: str
    status: str = Field(json_schema_extra={"enum": list[JsonValue](STATUS_ENUM)})
    idempotency_key: str | None = None
    created_at: float
    created_at_iso: str | None = iso_twin("created_at")
    ended_at: float | None = None
    ended_at_iso: str | None = iso_twin("ended_at")


class Dependencies(BaseModel):
    """A task's R21 links: what it depends on and what depends on it (at most 1,000 of each,
    in id order)."""

    task_id: str
    parents: list[DependencyRow] = Field(description="The tasks this one runs after.")
    children: list[DependencyRow] = Field(description="The tasks that run after this one.")


class WorkerOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    worker_id: str
    last_heartbeat_at: float
    last_heartbeat_at_iso: str | None = iso_twin("last_heartbeat_at")
    heartbeat_age_s: float
    is_live: bool = Field(description="state == 'live' (kept from before state).")
    state: Literal["live", "stale", "stopped"] = Field(
        description="stopped: it stopped cleanly; stale: its heartbeat is older than the TTL "
        "without a stop (it probably crashed); else live."
    )
    stopped_at: float | None = None
    lease_task_ids: list[str] = Field(
        default_factory=list, description="Every running task whose lease it holds."
    )
    leased_run_id: str | None = None


class WorkerList(BaseModel):
    workers: list[WorkerOut]


class Health(BaseModel):
    status: Literal["ok"]
    store: str


class Problem(BaseModel):
    """An RFC 9457 problem document; 422s add ``field`` and ``allowed``, 409s
    ``existing_task_id``."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None


class LimitIn(BaseModel):
    """A key's limit (R20): at least one of max_running or rate (with period_s)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"max_running": 3}, {"rate": 100, "period_s": 60}]},
    )

    max_running: int | None = Field(
        default=None, strict=True, description="At most this many running at once (0 pauses)."
    )
    rate: int | None = Field(default=None, strict=True, description="At most this many starts…")
    period_s: float | None = Field(default=None, strict=True, description="…per this period.")


class LimitOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    limit_key: str
    max_running: int | None
    rate: int | None
    period_s: float | None
    paused: bool
    running: int = Field(description="Tasks of the key running now.")
    recent: int = Field(description="Starts in the rate's window.")
    free: int = Field(description="How many more starts the key admits now.")
    updated_at: float
    updated_at_iso: str | None = iso_twin("updated_at")
    updated_by: str | None


class LimitList(BaseModel):
    limits: list[LimitOut]
