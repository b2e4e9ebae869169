"""Workflows: a graph of tasks admitted in one call, over R21's dependencies (issue 26).

A ``Workflow`` is a key and named steps; each step is an application without a key of its own
and the steps it runs ``after``. ``submit`` admits every step in one transaction (all or
nothing), layer by layer (a step's layer is one more than its deepest ``after``), each layer
one set-based write through ``admission.admit_in``, with ``depends_on`` the ids of its ``after``
steps just admitted. Each step's idempotency key is derived from the workflow's,
``<workflow key>/<step name>``, so submitting the same workflow again returns the same ids (the
whole graph replays), and changing a step under the same workflow key is a
``TaskIdempotencyConflict`` naming that step's key.

Patterns (docs/workflows.md): a chain (``chain``: each step after the one before), a group
(``group``: steps that share their ``after``, a fan-out), and a fan-in (a step ``after`` a group;
its function reads its parents' results from ``TaskContext.dependency_results``, R22).

Cycles cannot be built: ``after`` names steps already added (or ids of existing tasks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from taskward.adapters import build_registry
from taskward.admission import ADMISSION_SOURCES, MAX_BULK, admit_in, count_admissions
from taskward.applications import AdmittedApplication, validate_application
from taskward.errors import TaskValidationError
from taskward.models import MAX_KEY_LENGTH, TaskApplication, check_key
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import StateDB
from taskward.tracing import admission_span

# A step's name: printable, no "/" (it ends the step's key), short enough that the workflow's
# key, a "/" and the name fit one idempotency key.
MAX_STEP_NAME: Final = 100
STEP_NAME_ALLOWED: Final = (
    f"1..{MAX_STEP_NAME} printable characters without '/' or surrounding whitespace, unique "
    "in the workflow"
)
# What a step may set besides its kind and arguments: TaskApplication's other fields.
STEP_FIELDS: Final = frozenset(
    {
        "execution_target",
        "required_capabilities",
        "library_ref",
        "library_content_hash",
        "run_after",
        "priority",
        "max_attempts",
        "limit_key",
    }
)


@dataclass(frozen=True)
class Step:
    """A step added to a workflow: what ``after=`` takes."""

    name: str


@dataclass(frozen=True)
class _Spec:
    name: str
    action_kind: str
    args: Mapping[str, Any]
    after: tuple[Step | str, ...]
    fields: Mapping[str, Any] = field(default_factory=dict)


After = Step | str | Iterable[Step | str]
"""A step, an existing task's id, or several."""


class Workflow:
    """A graph of steps admitted together under one key (see the module's docstring).

    ``execution_target`` is every step's default (a step may name its own)."""

    def __init__(self, key: str, *, execution_target: str = "host") -> None:
        key = check_key("key", key.strip() if isinstance(key, str) else key)
        self.key = key
        self.execution_target = execution_target
        self._steps: dict[str, _Spec] = {}

    @property
    def steps(self) -> list[str]:
        """The steps' names, in the order they were added."""
        return list(self._steps)

    def key_of(self, step: Step | str) -> str:
        """The idempotency key of ``step``: ``<workflow key>/<step name>``."""
        return f"{self.key}/{step.name if isinstance(step, Step) else step}"

    def step(
        self,
        name: str,
        action_kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        after: After = (),
        **fields: Any,
    ) -> Step:
        """Add a step running ``action_kind`` with ``args`` after the steps (or existing task
        ids) in ``after``; ``fields`` are TaskApplication's others (``priority=``, ...).

        Raises:
            TaskValidationError: a bad or repeated name, an unknown field, an ``after`` step not
                in this workflow.
        """
        self._check_name(name)
        unknown = sorted(set(fields) - STEP_FIELDS)
        if unknown:
            raise TaskValidationError(
                f"steps.{name}.{unknown[0]}", fields[unknown[0]], sorted(STEP_FIELDS)
            )
        links = _after(after)
        for link in links:
            if isinstance(link, Step) and link.name not in self._steps:
                raise TaskValidationError(
                    f"steps.{name}.after", link.name, "steps already added to this workflow"
                )
        if len(self._steps) >= MAX_BULK:
            raise TaskValidationError("steps", len(self._steps) + 1, f"at most {MAX_BULK}")
        self._steps[name] = _Spec(name, action_kind, dict(args or {}), links, dict(fields))
        return Step(name)

    def group(
        self, steps: Iterable[tuple[str, str, Mapping[str, Any]]], *, after: After = ()
    ) -> list[Step]:
        """A fan-out: each ``(name, action_kind, args)`` a step after the same ``after``."""
        return [self.step(name, kind, args, after=after) for name, kind, args in steps]

    def chain(
        self, steps: Iterable[tuple[str, str, Mapping[str, Any]]], *, after: After = ()
    ) -> list[Step]:
        """A chain: each ``(name, action_kind, args)`` a step after the one before it (the
        first after ``after``)."""
        added: list[Step] = []
        for name, kind, args in steps:
            added.append(self.step(name, kind, args, after=added[-1:] if added else after))
        return added

    def _check_name(self, name: object) -> None:
        if (
            not isinstance(name, str)
            or not name
            or len(name) > MAX_STEP_NAME
            or "/" in name
            or name != name.strip()
            or not name.isprintable()
            or name in self._steps
        ):
            raise TaskValidationError("steps.name", name, STEP_NAME_ALLOWED)
        if len(self.key_of(name)) > MAX_KEY_LENGTH:
            raise TaskValidationError(
                "steps.name",
                name,
                f"a name that keeps '<workflow key>/<name>' within {MAX_KEY_LENGTH} characters",
            )

    def _layers(self) -> list[list[_Spec]]:
        depth: dict[str, int] = {}
        for spec in self._steps.values():  # added order: every after step comes first
            depth[spec.name] = 1 + max(
                (depth[a.name] for a in spec.after if isinstance(a, Step)), default=-1
            )
        layers: list[list[_Spec]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for spec in self._steps.values():
            layers[depth[spec.name]].append(spec)
        return layers

    def _application(self, spec: _Spec, ids: Mapping[str, str]) -> TaskApplication:
        fields = dict(spec.fields)
        fields.setdefault("execution_target", self.execution_target)
        return TaskApplication(
            action_kind=spec.action_kind,
            args=dict(spec.args),
            idempotency_key=self.key_of(spec.name),
            depends_on=[ids[a.name] if isinstance(a, Step) else a for a in spec.after],
            **fields,
        )

    def _validated(
        self, spec: _Spec, ids: Mapping[str, str], registry: TaskAdapterRegistry
    ) -> AdmittedApplication:
        try:
            return validate_application(self._application(spec, ids), registry)
        except TaskValidationError as exc:
            exc.message = f"step {spec.name!r}: {exc.message}"
            raise

    async def submit(
        self,
        db: StateDB,
        *,
        registry: TaskAdapterRegistry | None = None,
        admission_source: str = "library",
        now: float | None = None,
    ) -> dict[str, str]:
        """Admit every step in one transaction; returns step name -> task id (in the order the
        steps were added). The same workflow submitted again returns the same ids.

        Raises:
            TaskValidationError: an empty workflow, an invalid step (named; nothing written),
                an ``after`` id of a task that does not exist.
            TaskIdempotencyConflict: a step's key already admitted another application.
        """
        if admission_source not in ADMISSION_SOURCES:
            raise TaskValidationError(
                "admission_source", admission_source, sorted(ADMISSION_SOURCES)
            )
        if not self._steps:
            raise TaskValidationError("steps", 0, "at least one step")
        registry = registry if registry is not None else build_registry()
        # Each step is validated once, as its layer is admitted: an invalid step raises inside
        # the one transaction, which rolls back every layer before it (nothing is written).
        ids: dict[str, str] = {}
        created: set[str] = set()
        steps: list[AdmittedApplication] = []
        keys: dict[str, str] = {}
        with admission_span(admission_source, count=len(self._steps)) as span:
            async with db.transaction(now=now) as tx:
                for layer in self._layers():
                    admitted = [self._validated(spec, ids, registry) for spec in layer]
                    by_key = await admit_in(
                        tx, admitted, admission_source, created=created, span=span
                    )
                    for spec, item in zip(layer, admitted, strict=True):
                        ids[spec.name] = by_key[item.idempotency_key]
                    steps += admitted
                    keys.update(by_key)
        count_admissions(db, steps, keys, created)
        return {name: ids[name] for name in self._steps}


def _after(after: After) -> tuple[Step | str, ...]:
    if isinstance(after, Step | str):
        return (after,)
    links = tuple(after)
    for link in links:
        if not isinstance(link, Step | str):
            raise TaskValidationError("after", type(link).__name__, "steps or task ids")
    return links


__all__ = ["MAX_STEP_NAME", "STEP_FIELDS", "Step", "Workflow"]
