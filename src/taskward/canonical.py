"""Canonical JSON and content hashes (DESIGN.md R8): sort_keys, compact, UTF-8, no NaN.

Args are JSON only: nothing here (or anywhere in taskward) unpickles or evaluates input.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Serialise ``value`` canonically; raises ValueError/TypeError for non-JSON input."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def content_hash(value: Any) -> str:
    """``sha256:<lowercase hex>`` of the canonical JSON of ``value`` (ADR-0072 D2)."""
    return "sha256:" + hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def dumps(value: Any) -> str:
    """Compact JSON for storage columns (not canonical ordering-sensitive)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str | bytes | None) -> Any:
    return None if text is None else json.loads(text)
