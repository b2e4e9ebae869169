"""What an application is once validated (ADR-0072 D1/D2, DESIGN.md R8, R15): every check
that runs before any SQL, the canonical form that is hashed and stored
(``AdmittedApplication``) and its hash (``application_hash_of``). ``admission`` writes what this
module returns; a failure here writes nothing.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping, Sequence
from functools import cache, lru_cache
from typing import Any, Final, NamedTuple

from taskward.canonical import canonical_json
from taskward.capabilities import host_scoped_concurrency_key, normalize_capabilities
from taskward.errors import TaskValidationError
from taskward.fields import (
    check_depends_on,
    check_limit_key,
    check_max_attempts,
    check_priority,
    check_run_after,
)
from taskward.models import EXECUTION_TARGETS, TaskApplication, check_key, check_text
from taskward.models import MAX_KEY_LENGTH as MAX_KEY_LENGTH  # the key rule lives in models
from taskward.registry import TaskAdapterRegistry

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
