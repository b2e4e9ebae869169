"""What a receiver gets (ADR-0072 D6, R12): the envelope every target is sent, and the
Standard Webhooks headers that sign it for a webhook.

Invariants: the signature covers the message id, the send time and the exact body bytes
(``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, computed by the ``standardwebhooks``
package, so receivers verify with any published Standard Webhooks library); the id is the
notification's id, the same on every attempt, so receivers dedupe by it. The secret is never
logged, stored or put in an error message.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # imported where a signer is made: a worker without a webhook never needs it
    from standardwebhooks import Webhook

from taskward.canonical import canonical_json
from taskward.errors import TaskValidationError

ID_HEADER: Final = "webhook-id"
TIMESTAMP_HEADER: Final = "webhook-timestamp"
SIGNATURE_HEADER: Final = "webhook-signature"
EVENT_HEADER: Final = "X-Taskward-Event"  # not signed: the kind is inside the signed body too
ATTEMPT_HEADER: Final = "X-Taskward-Attempt"  # not signed: differs between attempts

SECRET_PREFIX: Final = "whsec_"


def envelope(row: Mapping[str, Any]) -> bytes:
    """The bytes every target receives for ``row``: canonical JSON of the notification's
    identity and its stored body. Stable across attempts."""
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


def webhook_signer(secret: str) -> Webhook:
    """The signer for ``secret``: a ``whsec_<base64>`` secret is the base64-decoded key (the
    Standard Webhooks form, verified by ``Webhook(secret)``); any other non-empty string is
    its UTF-8 bytes as the key (verified by ``Webhook(secret.encode())``).

    Raises:
        TaskValidationError: an empty secret, or a ``whsec_`` secret that is not base64 (the
        secret itself is never part of the message).
    """
    if secret.startswith(SECRET_PREFIX):
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if not key:
            raise TaskValidationError(
                "webhook secret", "whsec_…", "whsec_ followed by non-empty base64"
            )
    else:
        key = secret.encode("utf-8")
    if not key:
        raise TaskValidationError("webhook secret", "", "a non-empty secret")
    from standardwebhooks import Webhook

    return Webhook(key)


def webhook_headers(signer: Webhook, msg_id: str, timestamp: int, payload: bytes) -> dict[str, str]:
    """The Standard Webhooks headers signing ``payload`` as message ``msg_id`` sent at
    ``timestamp`` (integer epoch seconds)."""
    sent_at = datetime.fromtimestamp(timestamp, UTC)
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signer.sign(msg_id=msg_id, timestamp=sent_at, data=payload),
    }
