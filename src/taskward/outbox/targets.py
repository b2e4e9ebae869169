"""Where notifications go: the ``DeliveryTarget`` protocol, a signed webhook and a local
command, each validated when built."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from taskward.adapters.childenv import child_environment, validate_env_passthrough
from taskward.errors import TaskValidationError
from taskward.outbox.signing import (
    ATTEMPT_HEADER,
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign_payload,
)

DEFAULT_WEBHOOK_TIMEOUT_S: Final = 10.0
DEFAULT_COMMAND_TIMEOUT_S: Final = 30.0
_STDERR_TAIL: Final = 500

# The settings OutboxConfig.from_env reads (config.py); they stay with the targets they
# configure, since WebhookTarget's error names the secret's.
ENV_WEBHOOK_URL: Final = "TASKWARD_WEBHOOK_URL"
ENV_WEBHOOK_SECRET: Final = "TASKWARD_WEBHOOK_SECRET"
ENV_WEBHOOK_TIMEOUT: Final = "TASKWARD_WEBHOOK_TIMEOUT_S"
ENV_COMMAND: Final = "TASKWARD_NOTIFY_COMMAND"
ENV_COMMAND_TIMEOUT: Final = "TASKWARD_NOTIFY_COMMAND_TIMEOUT_S"


class DeliveryFailed(Exception):
    """Raised by a target when the receiver did not acknowledge; one failed attempt."""


class DeliveryTarget(Protocol):
    """Where notifications go. ``deliver`` returns only once the receiver acknowledged and
    raises (``DeliveryFailed`` or any error) otherwise; the deliverer bounds it by
    ``timeout_s``. ``name`` identifies the target in ``acked_targets`` (unique per deliverer)."""

    @property
    def name(self) -> str: ...

    @property
    def timeout_s(self) -> float: ...

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None: ...


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook answer of 3xx is a failed attempt: redirects would re-send signed bodies to
    an address the operator did not configure (and urllib turns a redirected POST into GET)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _post(url: str, payload: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
    request = urllib.request.Request(url, data=payload, headers=dict(headers), method="POST")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        exc.close()
        raise DeliveryFailed(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        # Only the endpoint: a webhook URL often carries its secret in its path or userinfo,
        # and this text is stored on the outbox row that every reader sees.
        raise DeliveryFailed(f"cannot reach {_endpoint(url)}: {exc.reason}") from None


def _endpoint(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, nothing that may be a credential."""
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"


def _validate_timeout(field_name: str, value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = -1.0
    if not number > 0 or number == float("inf"):
        raise TaskValidationError(field_name, value, "a number of seconds > 0")
    return number


@dataclass(frozen=True)
class WebhookTarget:
    """HTTP POST of the envelope, signed with HMAC-SHA256 of the exact body bytes.

    Any 2xx acknowledges; any other status, a redirect, a refused connection or no answer
    within ``timeout_s`` is a failed attempt.
    """

    url: str
    secret: str = field(repr=False)
    timeout_s: float = DEFAULT_WEBHOOK_TIMEOUT_S
    name: str = "webhook"

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise TaskValidationError("webhook url", self.url, "an http:// or https:// URL")
        if not self.secret:
            raise TaskValidationError(
                "webhook secret",
                "",
                "a non-empty secret",
                message=f"a webhook needs a signing secret ({ENV_WEBHOOK_SECRET}); "
                "receivers verify X-Taskward-Signature with it",
            )
        object.__setattr__(
            self, "timeout_s", _validate_timeout("webhook timeout_s", self.timeout_s)
        )

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "taskward-outbox",
            SIGNATURE_HEADER: sign_payload(self.secret, payload),
            TIMESTAMP_HEADER: str(int(time.time())),
            DELIVERY_HEADER: str(row["id"]),
            EVENT_HEADER: str(row["kind"]),
            ATTEMPT_HEADER: str(row["attempts"]),
        }
        await asyncio.to_thread(_post, self.url, payload, headers, self.timeout_s)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass(frozen=True)
class CommandTarget:
    """A local program: ``argv`` run directly (never through a shell) in its own process
    group, the envelope on stdin. Exit code 0 acknowledges; anything else, a program that
    cannot start or one still running at ``timeout_s`` (its group is killed) is a failed
    attempt. Its environment is the minimal one of ``childenv.child_environment`` (plus
    ``env_passthrough``), never the worker's, with ``TASKWARD_NOTIFICATION_ID``, ``_KIND``,
    ``_DEDUP_KEY`` and ``_ATTEMPT`` added."""

    argv: tuple[str, ...]
    timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    name: str = "command"
    env_passthrough: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        argv = self.argv
        if (
            isinstance(argv, str)
            or not argv
            or not all(isinstance(a, str) for a in argv)
            or not argv[0]
        ):
            raise TaskValidationError(
                "notify command", argv, "a non-empty list of strings (an argv, no shell)"
            )
        object.__setattr__(self, "argv", tuple(argv))
        object.__setattr__(
            self, "timeout_s", _validate_timeout("command timeout_s", self.timeout_s)
        )
        object.__setattr__(self, "env_passthrough", validate_env_passthrough(self.env_passthrough))

    async def deliver(self, payload: bytes, row: Mapping[str, Any]) -> None:
        # Not the worker's environment: its tokens and secrets stay out of a local program.
        notification = {
            "TASKWARD_NOTIFICATION_ID": str(row["id"]),
            "TASKWARD_NOTIFICATION_KIND": str(row["kind"]),
            "TASKWARD_NOTIFICATION_DEDUP_KEY": str(row["dedup_key"]),
            "TASKWARD_NOTIFICATION_ATTEMPT": str(row["attempts"]),
        }
        env = child_environment(notification, self.env_passthrough)
        # stderr goes to a file, not a pipe: a straggler holding a pipe open must not keep
        # Process.wait() from returning.
        with tempfile.TemporaryFile() as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise DeliveryFailed(f"cannot start {self.argv[0]!r}: {exc}") from None
            try:
                assert proc.stdin is not None
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(payload)
                    await proc.stdin.drain()
                proc.stdin.close()
                code = await proc.wait()
            except BaseException:  # timed out or cancelled: the group must not outlive us
                _kill_group(proc.pid)
                await proc.wait()
                raise
            if code != 0:
                err.seek(0)
                tail = err.read()[-_STDERR_TAIL:].decode("utf-8", "replace").strip()
                raise DeliveryFailed(f"exit code {code}" + (f": {tail}" if tail else ""))
