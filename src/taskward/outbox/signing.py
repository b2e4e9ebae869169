"""What a receiver gets (ADR-0072 D6, R12): the envelope every target is sent, its
HMAC-SHA256 signature and the webhook's headers."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final

from taskward.canonical import canonical_json

SIGNATURE_HEADER: Final = "X-Taskward-Signature"
TIMESTAMP_HEADER: Final = "X-Taskward-Timestamp"
DELIVERY_HEADER: Final = "X-Taskward-Delivery"
EVENT_HEADER: Final = "X-Taskward-Event"
ATTEMPT_HEADER: Final = "X-Taskward-Attempt"


def envelope(row: Mapping[str, Any]) -> bytes:
    """The bytes every target receives for ``row``: canonical JSON of the notification's
    identity and its stored body. Stable across attempts, so a signature is too."""
    return canonical_json(
        {
            "id": row["id"],
            "kind": row["kind"],
            "dedup_key": row["dedup_key"],
            "task_id": row["schedule_run_id"],
            "transition_id": row["transition_id"],
            "created_at": float(row["created_at"]),  # SQLite may hand back an int
            "body": row["body"],
        }
    ).encode("utf-8")


def sign_payload(secret: str, payload: bytes) -> str:
    """The ``X-Taskward-Signature`` value: ``sha256=<hex HMAC-SHA256 of the exact bytes>``."""
    digest = hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_signature(secret: str, payload: bytes, header: str | None) -> bool:
    """For receivers: whether ``header`` is the signature of ``payload`` (constant time)."""
    return header is not None and hmac.compare_digest(sign_payload(secret, payload), header)
