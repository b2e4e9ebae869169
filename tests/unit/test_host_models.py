"""ADR-0037 D1 payload validation: frozen, extra forbidden, non-empty strings, UTC datetimes,
a lease that covers the deadline, attempts from one, and closed literals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from taskward.host import SessionSummary, Task, TaskAck, TaskFailure, TaskResult
from taskward.host.models import checked_task

NOW = datetime(2026, 7, 9, 12, 0, tzinfo=UTC)
FAILURE_CODES = {
    "invalid_task",
    "flow_failed",
    "cancelled",
    "deadline",
    "summary_failed",
    "escalation_give_up",
}
REJECTIONS = {"missing_holder", "stale_lease", "attempt_ceiling"}


def task_fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "id": "task-1",
        "objective": "summarise the logs",
        "cwd": Path("/tmp"),
        "lease_id": "host:aaaaaaaa/1",
        "lease_expires_at": NOW + timedelta(minutes=5),
        "attempt": 1,
        "deadline": NOW + timedelta(minutes=4),
    }
    fields.update(changes)
    return fields


def summary() -> SessionSummary:
    return SessionSummary(facts={"task_id": "task-1"}, narrative=None, manifest_ref="m")


# -- shape ----------------------------------------------------------------------------------


def test_the_models_carry_exactly_the_recorded_fields() -> None:
    assert list(Task.model_fields) == [
        "id",
        "objective",
        "cwd",
        "lease_id",
        "lease_expires_at",
        "attempt",
        "deadline",
    ]
    assert list(TaskResult.model_fields) == ["run_id", "status", "summary_ref"]
    assert list(TaskFailure.model_fields) == ["code", "detail", "retryable"]
    assert list(TaskAck.model_fields) == ["applied", "rejection"]
    assert list(SessionSummary.model_fields) == ["facts", "narrative", "manifest_ref"]


def test_a_valid_task_keeps_its_values() -> None:
    task = Task(**task_fields())
    assert task.cwd == Path("/tmp") and task.attempt == 1
    assert task.deadline.tzinfo is not None


@pytest.mark.parametrize(
    "model",
    [
        lambda: Task(**task_fields()),
        lambda: TaskResult(run_id="r", status="completed", summary_ref="s"),
        lambda: TaskFailure(code="flow_failed", detail="d", retryable=True),
        lambda: TaskAck(applied=True),
        summary,
    ],
    ids=["Task", "TaskResult", "TaskFailure", "TaskAck", "SessionSummary"],
)
def test_every_payload_is_frozen(model: Any) -> None:
    instance = model()
    name = next(iter(type(instance).model_fields))
    with pytest.raises(ValidationError, match="frozen"):
        setattr(instance, name, getattr(instance, name))


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        (Task, task_fields()),
        (TaskResult, {"run_id": "r", "status": "completed", "summary_ref": "s"}),
        (TaskFailure, {"code": "flow_failed", "detail": "d", "retryable": True}),
        (TaskAck, {"applied": True}),
        (SessionSummary, {"facts": {}, "narrative": None, "manifest_ref": "m"}),
    ],
    ids=["Task", "TaskResult", "TaskFailure", "TaskAck", "SessionSummary"],
)
def test_every_payload_rejects_unknown_fields(model: Any, fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        model(**fields, status_detail="x")
    assert [e["type"] for e in caught.value.errors()] == ["extra_forbidden"]


# -- Task -------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["id", "objective", "lease_id"])
@pytest.mark.parametrize("value", ["", " ", "\t\n "])
def test_task_strings_must_be_non_empty_after_stripping(field: str, value: str) -> None:
    with pytest.raises(ValidationError, match=f"{field} must be non-empty"):
        Task(**task_fields(**{field: value}))


def test_task_strings_with_surrounding_space_are_kept_as_given() -> None:
    assert Task(**task_fields(objective="  do it  ")).objective == "  do it  "


@pytest.mark.parametrize("field", ["lease_expires_at", "deadline"])
def test_naive_datetimes_are_rejected_not_read_as_local_time(field: str) -> None:
    naive = (NOW + timedelta(minutes=1)).replace(tzinfo=None)
    with pytest.raises(ValidationError, match=f"{field} must be a timezone-aware UTC"):
        Task(**task_fields(**{field: naive}))


@pytest.mark.parametrize("field", ["lease_expires_at", "deadline"])
@pytest.mark.parametrize("hours", [2, -5])
def test_non_utc_offsets_are_rejected(field: str, hours: int) -> None:
    value = (NOW + timedelta(minutes=1)).astimezone(timezone(timedelta(hours=hours)))
    with pytest.raises(ValidationError, match=f"{field} must be a timezone-aware UTC"):
        Task(**task_fields(**{field: value}))


def test_naive_iso_strings_are_rejected_and_zulu_strings_accepted() -> None:
    with pytest.raises(ValidationError, match="timezone-aware UTC"):
        Task(**task_fields(deadline="2026-07-09T12:01:00"))
    task = Task(**task_fields(deadline="2026-07-09T12:01:00Z"))
    assert task.deadline == NOW + timedelta(minutes=1)


def test_a_zero_offset_timezone_is_utc() -> None:
    zero = timezone(timedelta(0))
    task = Task(**task_fields(deadline=(NOW + timedelta(minutes=1)).astimezone(zero)))
    assert task.deadline.utcoffset() == timedelta(0)


def test_the_deadline_may_equal_but_not_pass_the_lease_expiry() -> None:
    expires = NOW + timedelta(minutes=5)
    assert Task(**task_fields(lease_expires_at=expires, deadline=expires)).deadline == expires
    with pytest.raises(ValidationError, match="deadline must be <= lease_expires_at"):
        Task(**task_fields(lease_expires_at=expires, deadline=expires + timedelta(microseconds=1)))


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempt_starts_at_one(attempt: int) -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Task(**task_fields(attempt=attempt))


@pytest.mark.parametrize("missing", ["id", "cwd", "lease_expires_at", "attempt", "deadline"])
def test_every_task_field_is_required(missing: str) -> None:
    fields = task_fields()
    del fields[missing]
    with pytest.raises(ValidationError, match="Field required"):
        Task(**fields)


# -- results, failures, acks ------------------------------------------------------------------


@pytest.mark.parametrize("status", ["failed", "cancelled", "timed_out", "COMPLETED", ""])
def test_task_result_status_is_only_completed(status: str) -> None:
    assert TaskResult(run_id="r", status="completed", summary_ref="s").status == "completed"
    with pytest.raises(ValidationError, match="'completed'"):
        TaskResult(run_id="r", status=status, summary_ref="s")


@pytest.mark.parametrize("code", sorted(FAILURE_CODES))
def test_each_recorded_failure_code_is_accepted(code: str) -> None:
    assert TaskFailure(code=code, detail="d", retryable=False).code == code


@pytest.mark.parametrize("code", ["timeout", "failed", "completed", "", "deadline_exceeded"])
def test_failure_codes_are_closed(code: str) -> None:
    with pytest.raises(ValidationError) as caught:
        TaskFailure(code=code, detail="d", retryable=True)
    assert [e["type"] for e in caught.value.errors()] == ["literal_error"]


def test_an_ack_defaults_to_no_rejection() -> None:
    assert TaskAck(applied=True).rejection is None


@pytest.mark.parametrize("rejection", sorted(REJECTIONS))
def test_each_recorded_rejection_is_accepted(rejection: str) -> None:
    ack = TaskAck(applied=rejection == "attempt_ceiling", rejection=rejection)
    assert ack.rejection == rejection


@pytest.mark.parametrize("rejection", ["expired", "conflict", "", "STALE_LEASE"])
def test_ack_rejections_are_closed(rejection: str) -> None:
    with pytest.raises(ValidationError) as caught:
        TaskAck(applied=False, rejection=rejection)
    assert [e["type"] for e in caught.value.errors()] == ["literal_error"]


def test_a_session_summary_narrative_is_optional_but_must_be_given() -> None:
    assert summary().narrative is None
    with pytest.raises(ValidationError, match="Field required"):
        SessionSummary(facts={}, manifest_ref="m")  # type: ignore[call-arg]


def test_equal_payloads_compare_equal() -> None:
    assert TaskAck(applied=False, rejection="stale_lease") == TaskAck(
        applied=False, rejection="stale_lease"
    )
    assert Task(**task_fields()) == Task(**task_fields())


_CHECKED = dict(
    id="r-é",
    objective="noop r-é",
    cwd=Path("/tmp"),
    lease_id="host:a/1",
    lease_expires_at=datetime(2026, 1, 1, 0, 5, tzinfo=UTC),
    attempt=1,
    deadline=datetime(2026, 1, 1, 0, 4, tzinfo=UTC),
)


def test_checked_task_is_the_validated_task() -> None:
    """``checked_task`` builds a claim's Task without the model's validation when its own
    checks pass: it must be indistinguishable from ``Task(...)``."""
    checked, validated = checked_task(**_CHECKED), Task(**_CHECKED)  # type: ignore[arg-type]
    assert type(checked) is Task
    assert checked == validated
    assert checked.model_dump() == validated.model_dump()
    assert checked.model_fields_set == validated.model_fields_set
    assert checked.model_dump_json() == validated.model_dump_json()
    with pytest.raises(ValidationError):
        checked.attempt = 2  # frozen, like the validated one
    assert checked.model_copy(update={"attempt": 2}).attempt == 2


@pytest.mark.parametrize(
    "change",
    [
        {"id": "  "},
        {"objective": ""},
        {"lease_id": " "},
        {"attempt": 0},
        {"lease_expires_at": datetime(2026, 1, 1, 0, 5)},  # naive
        {"deadline": datetime(2026, 1, 1, 0, 4, tzinfo=timezone(timedelta(hours=1)))},
        {"deadline": datetime(2026, 1, 1, 0, 6, tzinfo=UTC)},  # past the lease
    ],
)
def test_checked_task_refuses_what_task_refuses(change: dict[str, Any]) -> None:
    values = {**_CHECKED, **change}
    with pytest.raises(ValidationError) as expected:
        Task(**values)  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as got:
        checked_task(**values)  # type: ignore[arg-type]
    assert got.value.errors(include_context=False) == expected.value.errors(include_context=False)


def test_a_task_results_payload_and_digest_are_the_models() -> None:
    from taskward.canonical import canonical_json
    from taskward.host.acks import result_payload as _result_payload

    result = TaskResult(run_id='r-"é"\u2028:1', status="completed", summary_ref="r:1\n")
    payload, digest = _result_payload(result)
    assert payload == result.model_dump(mode="json")
    assert digest == canonical_json(result.model_dump(mode="json"))
