from __future__ import annotations

import math

import pytest

from taskward.canonical import canonical_json, content_hash


def test_canonical_json_sorts_keys_and_is_compact_utf8() -> None:
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["é",null],"b":1}'


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_hash_is_sha256_prefixed_lowercase_hex_and_order_independent() -> None:
    h = content_hash({"a": 1, "b": 2})
    assert h == content_hash({"b": 2, "a": 1})
    assert h.startswith("sha256:") and len(h) == 7 + 64 and h[7:] == h[7:].lower()
