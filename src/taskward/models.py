"""Pure data of the records: TaskApplication (ADR-0072 D1) and the transition models (D3, D5).

No I/O here. Validation of a TaskApplication against a deployment's adapters lives in
``admission``; these types only carry values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

EXECUTION_TARGETS: Final[frozenset[str]] = frozenset(
    {"host", "local_worktree", "daytona", "remote_agent", "process"}
)
DEFAULT_EXECUTION_TARGET: Final = "host"

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

    model_config = ConfigDict(frozen=True)

    type: ActorType
    id: str = Field(min_length=1)

    def label(self) -> str:
        return f"{self.type}:{self.id}"


class StateReason(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: str
    summary: str = ""
    evidence_refs: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TransitionRequest(BaseModel):
    """A request to move one run along one declared edge (ADR-0072 D3)."""

    model_config = ConfigDict(frozen=True)

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

    model_config = ConfigDict(frozen=True)

    applied: bool
    conflict: bool = False
    previous_state: str | None = None
    current_state: str
    transition_id: str
    event_id: str | None = None
    replayed: bool = False


class CancelResult(BaseModel):
    """The answer to ``request_task_cancel`` (ADR-0072 D5)."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    state: Literal["cancelled", "cancellation_requested", "already_terminal"]
    current_status: str
