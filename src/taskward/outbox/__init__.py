"""The notification outbox (ADR-0072 D6, DESIGN.md R12): the deliverer, its targets (signed
webhooks, a local command), operator retry, purge and the read side.

Rows move ``pending -> delivering -> delivered | dead_letter | expired``; a failed attempt
returns to ``pending`` with a next-attempt time, an expired deliverer lease returns to
``pending``, and an operator retry returns ``dead_letter``/``expired`` to ``pending``. Every
statement here touches ``dispatch_outbox`` only: delivery state never changes a task (D6).
Terminal transitions enqueue their notification themselves (``transitions.rows.audit_rows``,
written by ``transitions.apply``).

Known limits: delivery is at least once — a receiver dedupes by the notification ``id`` (the
signed ``webhook-id`` header, also inside the signed body) or ``dedup_key``. A webhook request
that outlives its timeout is cancelled (httpx, in the deliverer's event loop) and counts as a
failed attempt; the receiver may still have acted on it. With no target configured nothing is
claimed: rows stay ``pending`` (and expire at ``expires_at``) until a target is configured;
``no_target_notice`` says so to operators (the dashboard, ``taskward outbox list``).

One owner per module; imports inside the package point one way (nothing imports ``deliverer``
or ``api``, ``signing`` imports no sibling):

- ``signing``: the envelope every target receives and its Standard Webhooks headers.
- ``targets`` -> ``signing``: the target protocol, ``WebhookTarget``, ``CommandTarget``.
- ``config`` -> ``targets``: ``OUTBOX_BACKOFF`` (the registry's one ``Backoff``), ``OutboxConfig``
  and its ``from_env``.
- ``deliverer`` -> ``config``, ``targets``, ``signing``: ``OutboxDeliverer``, the claim and
  lease of rows, and the HTTP client its webhooks share.
- ``api`` -> ``targets`` (its seconds validator only): enqueue and the operator's list, get,
  count, retry and purge; otherwise the store alone.

This module re-exports the names the rest of taskward and its tests import.
"""

from taskward.outbox.api import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_TTL_S,
    MAX_LIST_LIMIT,
    OUTBOX_STATUSES,
    count_notifications,
    enqueue_notification,
    get_notification,
    list_notifications,
    no_target_notice,
    purge_notifications,
    retry_notification,
    targets_configured,
)
from taskward.outbox.config import OUTBOX_BACKOFF, OutboxConfig
from taskward.outbox.deliverer import OutboxDeliverer
from taskward.outbox.signing import envelope
from taskward.outbox.targets import CommandTarget, DeliveryFailed, DeliveryTarget, WebhookTarget
from taskward.registry import Backoff

__all__ = [
    "DeliveryTarget",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_TTL_S",
    "MAX_LIST_LIMIT",
    "OUTBOX_STATUSES",
    "Backoff",
    "OUTBOX_BACKOFF",
    "CommandTarget",
    "DeliveryFailed",
    "OutboxConfig",
    "OutboxDeliverer",
    "WebhookTarget",
    "count_notifications",
    "enqueue_notification",
    "envelope",
    "get_notification",
    "list_notifications",
    "purge_notifications",
    "retry_notification",
    "no_target_notice",
    "targets_configured",
]
