"""Where notifications go: the ``DeliveryTarget`` protocol, a signed webhook and a local
command, each validated when built.

Invariants (R12 delivery, enforced here): a webhook acknowledges only with a 2xx; redirects are
never followed; at most ``MAX_RESPONSE_BYTES`` of an answer are read; a failure's text (stored on
the outbox row) and httpx's request log name the webhook's scheme, host and port alone, never
its path, query or userinfo, which often carry a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from taskward.adapters.childenv import child_environment, validate_env_passthrough
from taskward.errors import TaskValidationError
from taskward.outbox.signing import ATTEMPT_HEADER, EVENT_HEADER, webhook_headers, webhook_signer

if TYPE_CHECKING:
    # Imported where a client or a signer is made or used: ``import httpx`` also imports rich
    # (its CLI), standardwebhooks and http.cookiejar cost ~15 ms, which a worker's start must
    # not pay for when it delivers to no webhook (tests/acceptance/test_cli.py).
    import httpx
    from standardwebhooks import Webhook

DEFAULT_WEBHOOK_TIMEOUT_S: Final = 10.0
DEFAULT_COMMAND_TIMEOUT_S: Final = 30.0
_STDERR_TAIL: Final = 500

httpx_log: Final = logging.getLogger("httpx")  # logs each request's URL at INFO

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


# A receiver's answer is read up to this many bytes so its connection can be reused; a longer
# one is dropped unread (its connection closed), so a receiver cannot make a deliverer buffer.
MAX_RESPONSE_BYTES: Final = 64 * 1024


def new_http_client(*, max_connections: int) -> httpx.AsyncClient:
    """The client a deliverer owns for its webhooks: HTTP/1.1 keep-alive across deliveries,
    redirects never followed (a 3xx would re-send the signed body to an address the operator
    did not configure), no cookies kept between receivers' answers, proxies and CA bundle from
    the environment as for any HTTP client."""
    from http.cookiejar import CookieJar, DefaultCookiePolicy  # made here alone, as httpx is

    import httpx

    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    return httpx.AsyncClient(
        follow_redirects=False,
        limits=limits,
        headers={"User-Agent": "taskward-outbox"},
        # A jar that accepts no domain: one answer's cookie never reaches the next delivery.
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
    )


def _endpoint(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, nothing that may be a credential."""
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"


def _secret_parts(url: str) -> list[str]:
    """The parts of ``url`` that may carry a credential: userinfo, path, query, fragment."""
    parts = urllib.parse.urlsplit(url)
    found = [parts.username, parts.password, parts.query, parts.fragment]
    found.append(parts.path if parts.path not in ("", "/") else "")
    return [p for p in found if p]


def _describe(exc: Exception, url: str) -> str:
    """An httpx error's text, or its class name alone if the text names part of ``url``."""
    text = str(exc)
    if not text or any(part in text for part in _secret_parts(url)):
        return type(exc).__name__
    return text


class HideWebhookUrls(logging.Filter):
    """Rewrites httpx's request log lines (logger ``httpx``, level INFO: method and URL) for
    these URLs to their endpoint alone: a webhook URL often carries its secret. Attached by the
    deliverer while its client is open."""

    def __init__(self, urls: Sequence[str]) -> None:
        import httpx

        super().__init__()
        self._url_type = httpx.URL
        self._endpoints = {str(httpx.URL(url)): _endpoint(url) for url in urls}

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                self._endpoints.get(str(arg), arg) if isinstance(arg, self._url_type) else arg
                for arg in record.args
            )
        return True


async def _post(
    client: httpx.AsyncClient,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    timeout_s: float,
) -> None:
    """POST ``payload``; return on a 2xx, raise ``DeliveryFailed`` otherwise. The failure
    text names the endpoint alone: it is stored on the outbox row every reader sees."""
    import httpx

    try:
        async with client.stream(
            "POST", url, content=payload, headers=headers, timeout=timeout_s
        ) as response:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read > MAX_RESPONSE_BYTES:
                    break
    except httpx.TimeoutException:
        raise DeliveryFailed(f"no answer from {_endpoint(url)} within {timeout_s:g}s") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise DeliveryFailed(f"cannot reach {_endpoint(url)}: {_describe(exc, url)}") from None
    if not response.is_success:  # a 3xx too: redirects are not followed
        raise DeliveryFailed(f"HTTP {response.status_code} {response.reason_phrase}")


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
    """HTTP POST of the envelope, signed the Standard Webhooks way (``signing``).

    Any 2xx acknowledges; any other status, a redirect (never followed), a refused connection
    or no answer within ``timeout_s`` is a failed attempt. ``clock`` gives the signed send
    time (tests move it). The secret never appears in a repr, a log or an error.
    """

    url: str
    secret: str = field(repr=False)
    timeout_s: float = DEFAULT_WEBHOOK_TIMEOUT_S
    name: str = "webhook"
    clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)
    _signer: Webhook = field(init=False, repr=False, compare=False)

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
                "receivers verify webhook-signature with it",
            )
        try:
            signer = webhook_signer(self.secret)
        except TaskValidationError as exc:  # the message names the setting, never the value
            raise TaskValidationError(
                exc.field, exc.value, exc.allowed, message=f"{ENV_WEBHOOK_SECRET}: {exc}"
            ) from None
        object.__setattr__(self, "_signer", signer)
        object.__setattr__(
            self, "timeout_s", _validate_timeout("webhook timeout_s", self.timeout_s)
        )

    async def deliver(
        self, payload: bytes, row: Mapping[str, Any], *, client: httpx.AsyncClient | None = None
    ) -> None:
        """POST ``payload`` through ``client`` (the deliverer's), else through a client of
        its own for this one request."""
        headers = {
            "Content-Type": "application/json",
            **webhook_headers(self._signer, str(row["id"]), int(self.clock()), payload),
            EVENT_HEADER: str(row["kind"]),
            ATTEMPT_HEADER: str(row["attempts"]),
        }
        if client is not None:
            await _post(client, self.url, payload, headers, self.timeout_s)
            return
        async with new_http_client(max_connections=1) as own:
            own_filter = HideWebhookUrls([self.url])
            httpx_log.addFilter(own_filter)
            try:
                await _post(own, self.url, payload, headers, self.timeout_s)
            finally:
                httpx_log.removeFilter(own_filter)


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
