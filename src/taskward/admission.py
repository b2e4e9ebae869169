"""``submit_task``: the only code that inserts a run (ADR-0072 D1/D2, DESIGN.md R8); its
``admit_task`` form also says whether the call inserted the row (HTTP's 201 or 200).

Validation and canonicalisation happen before any SQL; a failure writes nothing. The insert is
``INSERT ... ON CONFLICT DO NOTHING`` followed by a read and a hash comparison, so the same key
with the same application returns the original id forever, and a different application raises
``TaskIdempotencyConflict`` without touching either task.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Final, NamedTuple

from taskward.adapters import build_registry
from taskward.canonical import canonical_json, dumps
from taskward.capabilities import host_scoped_concurrency_key, normalize_capabilities
from taskward.dependencies import link_admitted
from taskward.errors import TaskIdempotencyConflict, TaskValidationError
from taskward.fields import (
    check_depends_on,
    check_limit_key,
    check_max_attempts,
    check_priority,
    check_run_after,
)
from taskward.ids import new_id
from taskward.models import EXECUTION_TARGETS, TaskApplication, check_key, check_text
from taskward.models import MAX_KEY_LENGTH as MAX_KEY_LENGTH  # the key rule lives in models
from taskward.registry import TaskAdapterRegistry
from taskward.store.port import StateDB

MAX_ARGS_BYTES: Final = 1024 * 1024
# Capabilities are labels a worker advertises and a claim matches (ADR-0071 D5): a few short
# tokens. More, or longer, is a mistake or an attempt to bloat every claim's comparison.
MAX_CAPABILITIES: Final = 32
MAX_CAPABILITY_LENGTH: Final = 128
ADMISSION_SOURCES: Final = frozenset({"library", "cli", "http", "schedule", "retry"})


@cache
def _hostname() -> str:
    return socket.gethostname()


class AdmittedApplication(NamedTuple):
    """A validated, canonical application: exactly what is hashed and stored. (A named tuple:
    immutable, and built for every application of a bulk call, cheaper than a frozen dataclass:
    docs/benchmarks.md#figures-that-justified-design-choices.)"""

    action_kind: str
    args: dict[str, Any]
    args_json: str
    execution_target: str
    required_capabilities: list[str]
    library_ref: str | None
    library_content_hash: str | None
    idempotency_key: str
    application_hash: str
    concurrency_key: str | None
    # R15-R20: the scheduling fields, validated (``scheduling_fields``).
    run_after: float | None = None
    priority: int = 0
    max_attempts: int | None = None
    limit_key: str | None = None
    # R21: the ids this task depends on, sorted and de-duplicated.
    depends_on: tuple[str, ...] = ()


def _optional_text(field: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TaskValidationError(field, value, "null or a non-empty string")
    _check_text(field, value)
    return value


# Every text field is valid UTF-8 without NUL (R14): the one rule admission, cancellation and
# schedules share, in ``models``.
_check_text = check_text


def _check_json_text(field: str, value: Any) -> None:
    """``_check_text`` on every key and string inside a JSON value; ``field`` names the path."""
    if isinstance(value, str):
        _check_text(field, value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_text(f"{field} key", key)
            _check_json_text(f"{field}.{key}", item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json_text(f"{field}[{i}]", item)


_CAPABILITY_ALLOWED: Final = (
    f"at most {MAX_CAPABILITIES} labels, each 1..{MAX_CAPABILITY_LENGTH} printable characters "
    "without surrounding whitespace"
)


def _capabilities(value: object) -> list[str]:
    if (type(value) is list or type(value) is tuple) and not value:
        return []  # most applications: nothing to check
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise TaskValidationError("required_capabilities", value, "a list of non-empty strings")
    # Bounded before any label is looked at: the count, then each label's length (R8).
    if len(value) > MAX_CAPABILITIES:
        raise TaskValidationError(
            "required_capabilities", f"{len(value)} labels", _CAPABILITY_ALLOWED
        )
    for token in value:
        if not isinstance(token, str) or not token.strip() or token != token.strip():
            raise TaskValidationError("required_capabilities", token, _CAPABILITY_ALLOWED)
        if len(token) > MAX_CAPABILITY_LENGTH:
            raise TaskValidationError(
                "required_capabilities", f"a label of {len(token)} characters", _CAPABILITY_ALLOWED
            )
        if not token.isprintable():
            _check_text("required_capabilities", token)  # a NUL or a lone surrogate, named
            raise TaskValidationError("required_capabilities", token, _CAPABILITY_ALLOWED)
    return normalize_capabilities(value)


def _check_timeout(args: Mapping[str, Any], max_s: float) -> None:
    """``args.timeout_s`` of any kind: absent or null (the worker's default deadline), else a
    number of seconds in (0, max_s]. R5: a claim sets ``deadline_at = now + timeout_s`` for
    every kind, so an unbounded value (1e308) is a deadline no timestamp holds and a task that
    never leaves ``running``; it is refused here, before anything is stored."""
    timeout = args.get("timeout_s")
    if timeout is None:
        return
    # ``not 0 < t <= max`` also refuses NaN, and compares a huge int exactly (no overflow).
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= max_s
    ):
        raise TaskValidationError(
            "args.timeout_s",
            timeout,
            f"a number of seconds > 0 and <= {max_s:g} (this deployment's maximum, "
            "TASKWARD_MAX_TASK_TIMEOUT_S), or absent for the worker's default",
        )


@lru_cache(maxsize=4096)
def _json_text(value: str | None) -> str:
    """The canonical JSON of a short text or null; kinds, targets and library references repeat
    from one application to the next, so each is serialised once."""
    return canonical_json(value)


def application_hash_of(
    action_kind: str,
    args_json: str,
    execution_target: str,
    required_capabilities: list[str],
    library_ref: str | None,
    library_content_hash: str | None,
    *,
    run_after: float | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    limit_key: str | None = None,
    depends_on: Sequence[str] = (),
) -> str:
    """``sha256:<hex>`` of the canonical JSON of the six hashed fields (ADR-0072 D2), plus each
    R15 field that is not at its default, under its own name (so an application that uses none
    of them hashes exactly as D2 says).

    Spliced from the already-canonical ``args_json`` (keys in sorted order) so the arguments
    are serialised once; equal to ``content_hash`` of the same dict (a unit test checks).
    """
    capabilities = canonical_json(required_capabilities) if required_capabilities else "[]"
    # Keys in sorted order, as canonical JSON's sort_keys would place them.
    limit = f',"limit_key":{_json_text(limit_key)}' if limit_key is not None else ""
    ceiling = f',"max_attempts":{max_attempts}' if max_attempts is not None else ""
    rank = f',"priority":{priority}' if priority != 0 else ""
    after = f',"run_after":{canonical_json(run_after)}' if run_after is not None else ""
    links = f',"depends_on":{canonical_json(list(depends_on))}' if depends_on else ""
    envelope = (
        f'{{"action_kind":{_json_text(action_kind)},"args":{args_json}{links},'
        f'"execution_target":{_json_text(execution_target)},'
        f'"library_content_hash":{_json_text(library_content_hash)},'
        f'"library_ref":{_json_text(library_ref)}{limit}{ceiling}{rank},'
        f'"required_capabilities":{capabilities}{after}}}'
    )
    return "sha256:" + hashlib.sha256(envelope.encode("utf-8")).hexdigest()


def validate_application(
    app: TaskApplication, registry: TaskAdapterRegistry
) -> AdmittedApplication:
    """Validate and canonicalise ``app`` (never mutating it); raises TaskValidationError."""
    if not isinstance(app, TaskApplication):
        raise TaskValidationError("application", type(app).__name__, "a TaskApplication")
    key = app.idempotency_key
    # ADR-0072 D1: surrounding whitespace is not part of a key; the rest is models.check_key.
    key = check_key("idempotency_key", key.strip() if isinstance(key, str) else key)
    if isinstance(app.action_kind, str):
        _check_text("action_kind", app.action_kind)  # before the registry echoes it back
    kind, adapter = registry.resolve(app.action_kind)
    if app.execution_target not in EXECUTION_TARGETS:
        if isinstance(app.execution_target, str):
            _check_text("execution_target", app.execution_target)
        raise TaskValidationError(
            "execution_target", app.execution_target, sorted(EXECUTION_TARGETS)
        )
    raw_args = app.args
    if not (type(raw_args) is dict or isinstance(raw_args, Mapping)) or not all(
        isinstance(k, str) for k in raw_args
    ):
        raise TaskValidationError(
            "args", type(raw_args).__name__, "a JSON object (a dict with string keys)"
        )
    try:
        args_json = canonical_json(raw_args) if raw_args else "{}"
    except (TypeError, ValueError) as exc:
        raise TaskValidationError(
            "args",
            "not JSON-serializable",
            "JSON values only (no NaN, bytes or objects)",
            message=f"args must be JSON-serializable: {exc}",
        ) from exc
    try:
        args_size = len(args_json.encode("utf-8"))
    except UnicodeEncodeError:
        _check_json_text("args", app.args)  # names the offending string
        raise  # pragma: no cover - the walk above always finds it
    if "\\u0000" in args_json:  # fast path: only then walk to find (or clear) a NUL
        _check_json_text("args", app.args)
    if args_size > MAX_ARGS_BYTES:
        raise TaskValidationError(
            "args",
            f"{args_size} bytes",
            f"at most {MAX_ARGS_BYTES} bytes of JSON",
        )
    args = dict(app.args)
    if "timeout_s" in args:
        _check_timeout(args, registry.max_task_timeout_s)
    capabilities = _capabilities(app.required_capabilities)
    library_ref = _optional_text("library_ref", app.library_ref)
    library_hash = _optional_text("library_content_hash", app.library_content_hash)
    try:
        adapter.validate_args(args)
    except TaskValidationError:
        raise
    except ValueError as exc:
        raise TaskValidationError(
            "args",
            "rejected by the adapter",
            f"what {kind} accepts",
            message=f"args rejected by the {kind} adapter: {exc}",
        ) from exc
    validate_provenance = getattr(adapter, "validate_provenance", None)
    if validate_provenance is not None:
        validate_provenance(library_ref, library_hash)
    # R15: the scheduling fields. Most applications leave all four at their defaults: one
    # comparison each, then the D2 hash unchanged.
    run_after = app.run_after
    priority = app.priority
    max_attempts = app.max_attempts
    limit_key = app.limit_key
    depends_on = check_depends_on("depends_on", app.depends_on)
    if run_after is not None:
        run_after = check_run_after("run_after", run_after)
    if priority != 0 or type(priority) is not int:
        priority = check_priority("priority", priority)
    if max_attempts is not None:
        max_attempts = check_max_attempts("max_attempts", max_attempts)
    if limit_key is not None:
        limit_key = check_limit_key("limit_key", limit_key)
    application_hash = application_hash_of(
        kind,
        args_json,
        app.execution_target,
        capabilities,
        library_ref,
        library_hash,
        run_after=run_after,
        priority=priority,
        max_attempts=max_attempts,
        limit_key=limit_key,
        depends_on=depends_on,
    )
    if max_attempts is None:
        # R18: the kind's default ceiling is stored on the row, not hashed: it is the
        # deployment's configuration, not the application's (None: the queue's, in the insert).
        max_attempts = registry.max_attempts_for(kind)
    return AdmittedApplication(
        action_kind=kind,
        args=args,
        args_json=args_json,
        execution_target=app.execution_target,
        required_capabilities=capabilities,
        library_ref=library_ref,
        library_content_hash=library_hash,
        idempotency_key=key,
        application_hash=application_hash,
        concurrency_key=host_scoped_concurrency_key(_hostname(), capabilities)
        if capabilities
        else None,
        run_after=run_after,
        priority=priority,
        max_attempts=max_attempts,
        limit_key=limit_key,
        depends_on=depends_on,
    )


@dataclass(frozen=True)
class Admission:
    """What ``admit_task`` decided: the task id, and whether this call inserted the row (False
    when the key had already admitted the same application)."""

    task_id: str
    created: bool


async def submit_task(
    db: StateDB,
    app: TaskApplication,
    *,
    registry: TaskAdapterRegistry | None = None,
    admission_source: str = "library",
    schedule_id: str | None = None,
    now: float | None = None,
) -> str:
    """Admit ``app`` as a queued run and return its id (the existing id for a replayed key).

    Raises:
        TaskValidationError: bad input (nothing written); AdapterNotRegistered for the kind.
        TaskIdempotencyConflict: the key already admitted a different application.
    """
    admission = await admit_task(
        db,
        app,
        registry=registry,
        admission_source=admission_source,
        schedule_id=schedule_id,
        now=now,
    )
    return admission.task_id


async def admit_task(
    db: StateDB,
    app: TaskApplication,
    *,
    registry: TaskAdapterRegistry | None = None,
    admission_source: str = "library",
    schedule_id: str | None = None,
    now: float | None = None,
) -> Admission:
    """``submit_task`` that also says whether the row is new (HTTP answers 201 or 200 by it).

    Raises: as ``submit_task``.
    """
    admitted = validate_admission(app, registry, admission_source)
    if admitted.depends_on:
        return await _admit_with_dependencies(db, admitted, admission_source, schedule_id, now)
    # One statement, its own transaction (R8): INSERT ... ON CONFLICT DO NOTHING. Only when it
    # inserted nothing is the existing row read and its hash compared.
    params = insert_params(admitted, admission_source, schedule_id, now)
    if await db.execute("run_insert_if_new", params):
        db.wake("queued")
        return Admission(task_id=params["id"], created=True)
    existing = await db.fetchone("run_get_by_key", {"idempotency_key": admitted.idempotency_key})
    return replayed_admission(admitted, existing)


async def _admit_with_dependencies(
    db: StateDB,
    admitted: AdmittedApplication,
    admission_source: str,
    schedule_id: str | None,
    now: float | None,
) -> Admission:
    """``admit_task`` for an application with ``depends_on`` (R21): the insert, the links and
    the first readiness move in one transaction (``dependencies.link_admitted``); a replayed
    key links nothing (its task was linked when it was admitted)."""
    params = insert_params(admitted, admission_source, schedule_id, None)
    del params["now"]  # the statement's time is the transaction's
    async with db.transaction(now=now) as tx:
        if await tx.execute("run_insert_if_new", params):
            after = await link_admitted(
                tx, [(params["id"], admitted.depends_on, admitted.run_after)]
            )
            if after[params["id"]] == "queued":
                tx.notify("queued")
            return Admission(task_id=params["id"], created=True)
        existing = await tx.fetchone(
            "run_get_by_key", {"idempotency_key": admitted.idempotency_key}
        )
    return replayed_admission(admitted, existing)


def validate_admission(
    app: TaskApplication, registry: TaskAdapterRegistry | None, admission_source: str
) -> AdmittedApplication:
    """``admit_task``'s checks before any SQL (shared with ``taskward.client.SyncClient``)."""
    if admission_source not in ADMISSION_SOURCES:
        raise TaskValidationError("admission_source", admission_source, sorted(ADMISSION_SOURCES))
    return validate_application(app, registry if registry is not None else build_registry())


def insert_params(
    admitted: AdmittedApplication,
    admission_source: str,
    schedule_id: str | None,
    now: float | None,
    *,
    trigger_context: str = "{}",
    chain_parent_id: str | None = None,
    chain_depth: int = 0,
) -> dict[str, Any]:
    """``run_insert_if_new``'s parameters for one admission, with a new time-ordered id; the
    chain columns are an operator retry's (R19, ``resubmit.retry_task``)."""
    return {
        "id": new_id(),
        "schedule_id": schedule_id,
        "trigger_context": trigger_context,
        "chain_parent_id": chain_parent_id,
        "chain_depth": chain_depth,
        "action_kind": admitted.action_kind,
        "action_args": admitted.args_json,
        "concurrency_key": admitted.concurrency_key,
        "required_capabilities": dumps(admitted.required_capabilities),
        "execution_target": admitted.execution_target,
        "library_ref": admitted.library_ref,
        "library_content_hash": admitted.library_content_hash,
        "idempotency_key": admitted.idempotency_key,
        "application_hash": admitted.application_hash,
        "admission_source": admission_source,
        # R16: the statement sets queued_at to the later of its time and run_after; R18: a NULL
        # max_attempts stores the queue's ceiling read by the statement itself (R6).
        "run_after": admitted.run_after,
        "priority": admitted.priority,
        "max_attempts": admitted.max_attempts,
        "limit_key": admitted.limit_key,
        "now": now,
    }


def replayed_admission(
    admitted: AdmittedApplication, existing: Mapping[str, Any] | None
) -> Admission:
    """The answer when the insert found the key taken: ``existing`` (``run_get_by_key``'s row)
    must hold the same application (ADR-0072 D2), else TaskIdempotencyConflict."""
    if existing is None:  # pragma: no cover - the unique index makes this unreachable
        raise RuntimeError("admission insert conflicted but no row holds the key")
    if existing["application_hash"] != admitted.application_hash:
        raise TaskIdempotencyConflict(admitted.idempotency_key, existing["id"])
    return Admission(task_id=existing["id"], created=False)


MAX_BULK: Final = 10_000


async def submit_tasks(
    db: StateDB,
    apps: Sequence[TaskApplication],
    *,
    registry: TaskAdapterRegistry | None = None,
    admission_source: str = "library",
    now: float | None = None,
) -> list[str]:
    """Admit many applications in one transaction; returns their ids in order.

    Each application has ``submit_task``'s per-key semantics (a replayed key returns its
    original id; the same key within the call twice is one task). The call is all or nothing:
    any invalid application raises before anything is written, and a key that already admitted
    a different application raises ``TaskIdempotencyConflict`` and writes none of the batch.
    """
    if admission_source not in ADMISSION_SOURCES:
        raise TaskValidationError("admission_source", admission_source, sorted(ADMISSION_SOURCES))
    if len(apps) > MAX_BULK:
        raise TaskValidationError("apps", f"{len(apps)} applications", f"at most {MAX_BULK}")
    registry = registry if registry is not None else build_registry()
    admitted: list[AdmittedApplication] = []
    for index, app in enumerate(apps):
        try:
            admitted.append(validate_application(app, registry))
        except TaskValidationError as exc:
            exc.message = f"application {index}: {exc.message}"
            raise
    by_key: dict[str, AdmittedApplication] = {}
    for item in admitted:
        first = by_key.setdefault(item.idempotency_key, item)
        if first.application_hash != item.application_hash:
            raise TaskValidationError(
                "idempotency_key",
                item.idempotency_key,
                "one application per key within a call",
                message=f"idempotency_key {item.idempotency_key!r} names two different "
                "applications in this call",
            )
    unique = list(by_key.values())
    ids: dict[str, str] = {}
    async with db.transaction(now=now) as tx:
        # One set-based write for the whole call; a key already taken inserts nothing.
        rows: list[dict[str, Any]] = [
            insert_params(a, admission_source, None, None) for a in unique
        ]
        for params in rows:
            del params["now"]  # the statement's time is the transaction's
        [inserted] = await tx.write_many([("run_insert_many_if_new", rows)])
        new_ids: set[str] = set()
        if inserted == len(unique):
            ids = {a.idempotency_key: row["id"] for a, row in zip(unique, rows, strict=True)}
            new_ids = set(ids.values())
        else:
            # Some key was taken: the row holding each key says whose it is (ours carries the
            # id we made; another's must hold the same application).
            found = await tx.fetchone_each(
                "run_get_by_key", [{"idempotency_key": a.idempotency_key} for a in unique]
            )
            for item, row, ours in zip(unique, found, rows, strict=True):
                assert row is not None  # the unique index holds the key
                if row["id"] != ours["id"] and row["application_hash"] != item.application_hash:
                    raise TaskIdempotencyConflict(item.idempotency_key, row["id"])
                ids[item.idempotency_key] = row["id"]
                if row["id"] == ours["id"]:
                    new_ids.add(row["id"])
        links = [
            (ids[a.idempotency_key], a.depends_on, a.run_after)
            for a in unique
            if a.depends_on and ids[a.idempotency_key] in new_ids
        ]
        if links:  # R21: the new rows with dependencies, linked and moved in this transaction
            await link_admitted(tx, links)
        if inserted:
            tx.notify("queued")
    return [ids[a.idempotency_key] for a in admitted]
