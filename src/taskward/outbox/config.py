"""What a deliverer sends where, and how often it looks: ``OUTBOX_BACKOFF`` (the registry's one
``Backoff``), ``OutboxConfig`` and
the targets ``OutboxConfig.from_env`` reads from the environment."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from taskward.adapters.childenv import ENV_CHILD_ENV_PASSTHROUGH, parse_env_passthrough
from taskward.errors import TaskValidationError
from taskward.outbox.targets import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_WEBHOOK_TIMEOUT_S,
    ENV_COMMAND,
    ENV_COMMAND_TIMEOUT,
    ENV_WEBHOOK_SECRET,
    ENV_WEBHOOK_TIMEOUT,
    ENV_WEBHOOK_URL,
    CommandTarget,
    DeliveryTarget,
    WebhookTarget,
    _validate_timeout,
)
from taskward.registry import Backoff

# A delivery lease covers every target's timeout plus this slack, so a live deliverer has given
# up on a row before any other deliverer may reclaim it.
LEASE_SLACK_S: Final = 30.0


# A delivery's backoff is taskward's one policy (registry.Backoff): 10 s after the first failed
# attempt, doubling to an hour, +-20 % so deliverers do not retry in lockstep.
OUTBOX_BACKOFF: Final = Backoff(base_s=10.0, factor=2.0, cap_s=3600.0, jitter=0.2)


@dataclass(frozen=True)
class OutboxConfig:
    """What a deliverer sends where, and how often it looks. ``from_env`` reads the targets."""

    targets: tuple[DeliveryTarget, ...] = ()
    poll_interval_s: float = 1.0
    batch_size: int = 20
    concurrency: int = 4
    backoff: Backoff = OUTBOX_BACKOFF
    lease_s: float | None = None  # None: the targets' timeouts plus LEASE_SLACK_S

    def __post_init__(self) -> None:
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise TaskValidationError("targets", names, "targets with distinct names")
        if self.batch_size < 1:
            raise TaskValidationError("batch_size", self.batch_size, "an integer >= 1")
        if self.concurrency < 1:
            raise TaskValidationError("concurrency", self.concurrency, "an integer >= 1")
        budget = sum(t.timeout_s for t in self.targets)
        if self.lease_s is not None and self.lease_s <= budget:
            raise TaskValidationError(
                "lease_s", self.lease_s, f"more than the targets' timeouts together ({budget:g}s)"
            )

    @property
    def effective_lease_s(self) -> float:
        if self.lease_s is not None:
            return self.lease_s
        return sum(t.timeout_s for t in self.targets) + LEASE_SLACK_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OutboxConfig:
        """Targets from ``TASKWARD_WEBHOOK_URL`` (+ ``_SECRET``, required, and ``_TIMEOUT_S``)
        and ``TASKWARD_NOTIFY_COMMAND`` (a JSON argv list, + ``_TIMEOUT_S``; its environment
        passes ``TASKWARD_CHILD_ENV_PASSTHROUGH`` through, as a task's does)."""
        env = os.environ if environ is None else environ
        targets: list[DeliveryTarget] = []
        url = env.get(ENV_WEBHOOK_URL, "").strip()
        if url:
            targets.append(
                WebhookTarget(
                    url=url,
                    secret=env.get(ENV_WEBHOOK_SECRET, ""),
                    timeout_s=_validate_timeout(
                        ENV_WEBHOOK_TIMEOUT,
                        env.get(ENV_WEBHOOK_TIMEOUT, DEFAULT_WEBHOOK_TIMEOUT_S),
                    ),
                )
            )
        command = env.get(ENV_COMMAND, "").strip()
        if command:
            try:
                argv = json.loads(command)
            except json.JSONDecodeError:
                argv = None
            if not isinstance(argv, list):
                raise TaskValidationError(
                    ENV_COMMAND, command, 'a JSON argv list such as ["/usr/local/bin/notify"]'
                )
            targets.append(
                CommandTarget(
                    argv=tuple(argv),
                    timeout_s=_validate_timeout(
                        ENV_COMMAND_TIMEOUT,
                        env.get(ENV_COMMAND_TIMEOUT, DEFAULT_COMMAND_TIMEOUT_S),
                    ),
                    env_passthrough=parse_env_passthrough(env.get(ENV_CHILD_ENV_PASSTHROUGH)),
                )
            )
        return cls(targets=tuple(targets))
