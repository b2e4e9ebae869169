"""Pure data of the records: TaskApplication (ADR-0072 D1) and the transition models (D3, D5).

No I/O here. Validation of a TaskApplication against a deployment's adapters lives in
``admission``; these types only carry values. The text rules every binding shares (what any
stored string and any idempotency key may hold) live here, below admission, cancellation and
schedules alike, so all three enforce one rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from taskward.errors import TaskValidationError

EXECUTION_TARGETS: Final[frozenset[str]] = frozenset(
    {"host", "local_worktree", "daytona", "remote_agent", "process"}
)
DEFAULT_EXECUTION_TARGET: Final = "host"

# Idempotency keys (admission, cancellation, manual schedule fires): 1..255 characters.
MAX_KEY_LENGTH: Final = 255
KEY_ALLOWED: Final = (
    f"a non-empty string of at most {MAX_KEY_LENGTH} printable characters (letters, digits, "
    "punctuation, symbols and the space; no control characters, no NUL, no lone surrogates)"
)


def shown_text(value: str) -> str:
    """``value`` as text that always encodes: a lone surrogate becomes ``\\udXXX``."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def check_text(field: str, value: str) -> None:
    """Refuse text no backend can store alike: PostgreSQL keeps no NUL character and UTF-8 has
    no lone surrogates (a JSON ``"\\ud800"`` escape, or a shell argument decoded with
    surrogateescape). Without this, such input passes on SQLite, fails in its driver with a
    UnicodeEncodeError (a 500) and is a store error on PostgreSQL; with it, every binding
    answers with a validation error naming the field (R14). The one text rule of admission,
    cancellation and schedules."""
    allowed = None
    if "\x00" in value:
        allowed = "text without NUL (\\u0000) characters"
    elif not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            allowed = "valid Unicode text (no lone surrogates)"
    if allowed is not None:
        # The error carries the escaped text (it must encode wherever it is shown); the
        # message is the repr of what was given (``'x\\ud800'``).
        raise TaskValidationError(
            field,
            shown_text(value),
            allowed,
            message=f"{field} {value!r} is invalid; allowed: {allowed}",
        )


def check_key(field: str, value: object) -> str:
    """An idempotency key as given: non-empty, at most ``MAX_KEY_LENGTH`` characters, valid
    text and printable (``str.isprintable``: no control characters such as tab or newline, no
    format or separator characters other than the ASCII space). Returns it unchanged.

    Keys are shown in logs, headers and the CLI's lines; a newline in one forges a line, and a
    key nobody can type again cannot be used to retry (ADR-0072 D1)."""
    if not isinstance(value, str) or not value.strip():
        raise TaskValidationError(field, value, KEY_ALLOWED)
    if len(value) > MAX_KEY_LENGTH:
        raise TaskValidationError(field, f"{len(value)} characters", KEY_ALLOWED)
    if not value.isprintable():
        check_text(field, value)  # a NUL or a lone surrogate, named as such
        raise TaskValidationError(field, value, KEY_ALLOWED)
    return value


ActorType = Literal["scheduler", "operator", "system", "webhook", "agent"]
ACTOR_TYPES: Final[tuple[str, ...]] = ("scheduler", "operator", "system", "webhook", "agent")


@dataclass(frozen=True)
class TaskApplication:
    """One unit of work offered for admission (ADR-0072 D1).

    ``idempotency_key`` is required: the same key with the same application returns the original
    task id forever; the same key with a different application is a conflict.
    """

    action_kind: str
    args: dict[str, Any]
    execution_target: str
    idempotency_key: str
    required_capabilities: list[str] = field(default_factory=list)
    library_ref: str | None = None
    library_content_hash: str | None = None
    # DESIGN.md R15: keyword fields after the records' own, each with a default that leaves the
    # application's hash exactly as ADR-0072 D2 computes it (admission.application_hash_of).
    run_after: float | None = None
    """R16: epoch seconds before which no claim takes the task (None: as soon as possible)."""
    priority: int = 0
    """R17: -100..100, higher first; equal priorities keep the oldest-first order."""
    max_attempts: int | None = None
    """R18: 1..100, this task's attempt ceiling (None: its kind's default, else the queue's)."""
    limit_key: str | None = None
    """R20: a limit key beside the implicit ``kind:<action_kind>`` (e.g. ``tenant:acme``)."""
    depends_on: list[str] = field(default_factory=list)
    """R21: ids of existing tasks this one runs after: it waits (``waiting_dependency``) until
    every one has ``completed``, and is skipped (``dependency_failed``) if one ends otherwise."""


M = TypeVar("M", bound=BaseModel)
_set: Final = object.__setattr__


def constructed(cls: type[M], values: dict[str, Any], fields_set: Iterable[str]) -> M:
    """The instance ``cls.model_construct(**values)`` builds, without its per-field loop: for
    hot paths whose values are already of their fields' types and valid (the caller checks).
    ``values`` must hold every field of ``cls``, defaults included; ``fields_set`` the ones the
    caller gave. Tests hold each use equal to the validated model."""
    instance = cls.__new__(cls)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", set(fields_set))
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


class Actor(BaseModel):
    """Who caused a transition; recorded on its fact as ``<type>:<id>``."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    type: ActorType
    id: str = Field(min_length=1)

    def label(self) -> str:
        return f"{self.type}:{self.id}"


class StateReason(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    code: str
    summary: str = ""
    evidence_refs: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TransitionRequest(BaseModel):
    """A request to move one run along one declared edge (ADR-0072 D3)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    entity_type: str = "schedule_run"
    entity_id: str = Field(min_length=1)
    from_state: str
    to_state: str
    reason: StateReason
    actor: Actor
    idempotency_key: str = Field(min_length=1)


class TransitionResult(BaseModel):
    """The outcome of ``transition_task``.

    A lost compare-and-swap is a value, not an exception: ``applied=False, conflict=True`` with
    the observed ``current_state``; then ``transition_id`` names no stored fact and ``event_id``
    is None.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    applied: bool
    conflict: bool = False
    previous_state: str | None = None
    current_state: str
    transition_id: str
    event_id: str | None = None
    replayed: bool = False


class CancelResult(BaseModel):
    """The answer to ``request_task_cancel`` (ADR-0072 D5)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    task_id: str
    state: Literal["cancelled", "cancellation_requested", "already_terminal"]
    current_status: str
