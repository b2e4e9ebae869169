"""Canonical JSON and content hashes (DESIGN.md R8): sort_keys, compact, UTF-8, no NaN.

Args are JSON only: nothing here (or anywhere in taskward) unpickles or evaluates input.
"""

from __future__ import annotations

import hashlib
import json
import math
from json.encoder import encode_basestring
from typing import Any

# Encoders built once: ``json.dumps`` with options builds a new encoder on every call, and these
# run several times per task on the worker's hot path.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """Serialise ``value`` canonically; raises ValueError/TypeError for non-JSON input."""
    return _CANONICAL.encode(value)


def json_string(text: str) -> str:
    """The canonical JSON of one string (as ``canonical_json(text)``, without the encoder)."""
    return encode_basestring(text)


def _plain(value: Any) -> bool:
    """True when ``value`` is JSON already: str-keyed dicts, lists, str, int, finite float,
    bool, None. Such a value encodes the same before and after ``model_dump(mode="json")``."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list:
        return all(_plain(item) for item in value)
    if kind is dict:
        return all(type(key) is str and _plain(item) for key, item in value.items())
    return False


def plain_canonical_json(value: Any) -> str | None:
    """``canonical_json(value)`` when ``value`` is plain JSON (``_plain``), else None: the
    caller then serialises through its model, which converts the other types first."""
    if not value and (type(value) is list or type(value) is dict):
        return "[]" if type(value) is list else "{}"
    return _CANONICAL.encode(value) if _plain(value) else None


def text_hash(canonical: str) -> str:
    """``sha256:<lowercase hex>`` of an already canonical JSON text."""
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def content_hash(value: Any) -> str:
    """``sha256:<lowercase hex>`` of the canonical JSON of ``value`` (ADR-0072 D2)."""
    return text_hash(canonical_json(value))


def dumps(value: Any) -> str:
    """Compact JSON for storage columns (not canonical ordering-sensitive)."""
    if not value and isinstance(value, list | dict):  # most evidence and metadata: no encoder
        return "[]" if isinstance(value, list) else "{}"
    return _COMPACT.encode(value)


def loads(text: str | bytes | None) -> Any:
    """JSON text to its value; the empty documents most stored columns hold (arguments,
    evidence, capabilities, trigger context) without the parser: a fresh ``{}`` or ``[]``."""
    if text is None:
        return None
    if text == "{}" or text == b"{}":
        return {}
    if text == "[]" or text == b"[]":
        return []
    return json.loads(text)
