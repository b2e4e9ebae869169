"""Keyset cursors of the listings (tasks, outbox notifications): ``(created_at, id)`` of a
page's last row, as unpadded url-safe base64 of the JSON ``[created_at, "id"]``.

A cursor is client input: every binding bounds its length with ``MAX_CURSOR_LENGTH``, and
``decode_cursor`` accepts only the exact shape ``encode_cursor`` writes, matched by a regular
expression before any JSON is parsed, so a crafted cursor (deeply nested JSON, another type,
padding games) is a ``TaskValidationError`` (422) and never reaches a recursive parser.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from taskward.errors import TaskValidationError

# One bound for every binding (API query parameter, dashboard, CLI through the decoder): a
# cursor this function writes is ~60 characters plus the id (at most 255) in base64.
MAX_CURSOR_LENGTH: Final = 1000

# What ``json.dumps([created_at, id])`` writes (ASCII: ensure_ascii escapes the rest): a finite
# number, then one JSON string. Nothing nests, so nothing here can recurse.
_SHAPE: Final = re.compile(
    r'\[(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?), ("(?:[^"\\\x00-\x1f]|\\.)*")\]'
)
_ALLOWED: Final = "a cursor returned by a previous page"


def encode_cursor(row: Mapping[str, Any]) -> str:
    raw = json.dumps([row["created_at"], row["id"]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """``(created_at, id)`` of ``cursor``; raises TaskValidationError("cursor") for anything
    ``encode_cursor`` did not write."""
    shown = cursor[:40] if isinstance(cursor, str) else cursor
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_LENGTH:
        raise TaskValidationError("cursor", shown, _ALLOWED)
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        # validate=True: characters outside the alphabet are an error, not silently dropped.
        text = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
    except (ValueError, binascii.Error) as exc:  # UnicodeDecodeError is a ValueError
        raise TaskValidationError("cursor", shown, _ALLOWED) from exc
    match = _SHAPE.fullmatch(text)
    if match is None:
        raise TaskValidationError("cursor", shown, _ALLOWED)
    try:
        created_at = float(match.group(1))
        task_id = json.loads(match.group(2))  # one flat string literal
    except ValueError as exc:
        raise TaskValidationError("cursor", shown, _ALLOWED) from exc
    if not isinstance(task_id, str) or "\x00" in task_id or not math.isfinite(created_at):
        raise TaskValidationError("cursor", shown, _ALLOWED)
    return created_at, task_id
