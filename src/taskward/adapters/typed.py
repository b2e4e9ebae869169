"""The typed arguments of a ``@taskward.task`` function (issue 29): its parameters' type hints as
a pydantic model, checked at admission (every binding: library, typed handle, CLI, HTTP) and
again in the worker just before the call, which then receives the validated values (an ISO
string becomes the ``datetime`` its parameter declares).

A function whose parameters carry no annotation has no model: only the names are checked
(``python._check_bind``), as before. The worker-filled parameters (the cancellation token, the
``TaskContext``) and ``*args``/``**kwargs`` are not fields; names beyond the declared ones are
the name check's concern, not this module's. Validation is pydantic's default (lax) mode:
``"48"`` is a valid ``int``, ``"x"`` is not. The stored arguments are what was admitted: the
model converts, it never rewrites a row.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from taskward.errors import TaskValidationError

_SKIPPED_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@cache
def _model(fn: Callable[..., Any], skipped: frozenset[str]) -> type[BaseModel] | None:
    try:
        params = inspect.signature(fn).parameters
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError, NameError):  # no signature, or hints that do not resolve
        return None
    fields: dict[str, Any] = {}
    typed = False
    for name, param in params.items():
        if param.kind in _SKIPPED_KINDS or name in skipped:
            continue
        annotation = hints.get(name, Any)
        typed = typed or name in hints
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (annotation, default)
    if not typed:
        return None
    name = f"{getattr(fn, '__name__', 'task')}_args"
    config = ConfigDict(extra="ignore", arbitrary_types_allowed=True)
    return create_model(name, __config__=config, **fields)


def args_model(fn: Callable[..., Any], skipped: Iterable[str] = ()) -> type[BaseModel] | None:
    """The model of ``fn``'s typed parameters (``skipped``: those the worker fills), or None."""
    try:
        return _model(fn, frozenset(skipped))
    except TypeError:  # an unhashable callable object: no cache, no model
        return None


def _refused(exc: ValidationError, field: str, kind: str) -> TaskValidationError:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return TaskValidationError(
        f"{field}.{where}" if where else field,
        first.get("input"),
        first["msg"],
        message=f"{field}.{where} is invalid for {kind}: {first['msg']} "
        f"(given {first.get('input')!r})",
    )


def _checked(
    fn: Callable[..., Any], kwargs: Mapping[str, Any], skipped: Iterable[str], field: str, kind: str
) -> BaseModel | None:
    """``kwargs`` validated by ``fn``'s model (None: it has none)."""
    model = args_model(fn, skipped)
    if model is None:
        return None
    try:
        return model.model_validate(kwargs)
    except ValidationError as exc:
        raise _refused(exc, field, kind or getattr(fn, "__name__", "the task")) from None


def validated(
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    *,
    skipped: Iterable[str] = (),
    field: str = "args",
    kind: str = "",
) -> dict[str, Any]:
    """``kwargs`` with each typed parameter's value validated and converted by its type hint
    (the others as given).

    Raises:
        TaskValidationError: naming ``<field>.<parameter>`` and what its type allows.
    """
    out = dict(kwargs)
    found = _checked(fn, kwargs, skipped, field, kind)
    if found is not None:
        for name in found.model_fields_set:
            out[name] = getattr(found, name)
    return out


def as_json(
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    *,
    skipped: Iterable[str] = (),
    kind: str = "",
) -> dict[str, Any]:
    """``kwargs`` validated and turned into JSON values by the typed parameters' types (a
    ``datetime`` becomes its ISO text), as a typed handle admits them.

    Raises:
        TaskValidationError: as ``validated``.
    """
    out = dict(kwargs)
    found = _checked(fn, kwargs, skipped, "args", kind)
    if found is not None:
        out.update(found.model_dump(mode="json", include=set(found.model_fields_set)))
    return out


def json_schema(
    fn: Callable[..., Any], skipped: Iterable[str] = (), *, ref_template: str | None = None
) -> dict[str, Any]:
    """The JSON Schema of ``fn``'s arguments: its typed model's (nested definitions under
    ``$defs``, referred to by ``ref_template``: pydantic's default when None), else an object
    naming the parameters (any value each)."""
    model = args_model(fn, skipped)
    if model is not None:
        if ref_template is None:
            return model.model_json_schema()
        return model.model_json_schema(ref_template=ref_template)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {"type": "object"}
    names = [n for n, p in params.items() if p.kind not in _SKIPPED_KINDS and n not in set(skipped)]
    required = [n for n in names if params[n].default is inspect.Parameter.empty]
    schema: dict[str, Any] = {"type": "object", "properties": {n: {} for n in names}}
    if required:
        schema["required"] = required
    return schema
