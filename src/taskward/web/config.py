"""Configuration of the HTTP service: API tokens with scopes, the body limit, hosts, sessions.

Tokens come from ``TASKWARD_API_TOKENS`` (``name:token:scope+scope,...``) and/or the file named by
``TASKWARD_API_TOKENS_FILE`` (one ``name:token:scopes`` a line; ``#`` starts a comment). Scopes
are ``submit``, ``read`` and ``operate`` (cancel, outbox retry, schedule fire/enable/disable);
``*`` grants all three. Capability labels are routing hints and never appear here.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from taskward.errors import TaskValidationError
from taskward.web.throttle import FailureLimits

SCOPES: Final[tuple[str, ...]] = ("submit", "read", "operate")
ALL_SCOPES: Final = "*"
DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
MIN_TOKEN_LENGTH: Final = 16
TOKENS_ENV: Final = "TASKWARD_API_TOKENS"
TOKENS_FILE_ENV: Final = "TASKWARD_API_TOKENS_FILE"
SESSION_SECRET_ENV: Final = "TASKWARD_SESSION_SECRET"
MAX_BODY_ENV: Final = "TASKWARD_HTTP_MAX_BODY_BYTES"
AUTH_MAX_FAILURES_ENV: Final = "TASKWARD_AUTH_MAX_FAILURES"
AUTH_WINDOW_ENV: Final = "TASKWARD_AUTH_FAILURE_WINDOW_S"
AUTH_BLOCK_ENV: Final = "TASKWARD_AUTH_BLOCK_S"
AUTH_MAX_BLOCK_ENV: Final = "TASKWARD_AUTH_MAX_BLOCK_S"
TRUSTED_PROXIES_ENV: Final = "TASKWARD_TRUSTED_PROXIES"
LOOPBACK_HOSTS: Final[tuple[str, ...]] = ("localhost", "127.0.0.1", "::1")

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_TOKEN_FORMAT: Final = "name:token:scope+scope (scopes: submit, read, operate or *)"


@dataclass(frozen=True)
class ApiToken:
    """One configured bearer token. Its ``name`` is the actor id of what it causes."""

    name: str
    token: str = field(repr=False)
    scopes: frozenset[str]


def parse_token_spec(spec: str, *, source: str = TOKENS_ENV) -> ApiToken:
    """``name:token:scope+scope`` -> ApiToken; raises TaskValidationError naming ``source``."""
    parts = spec.strip().split(":")
    if len(parts) != 3:
        raise TaskValidationError(
            source,
            parts[0] + ":***" if parts else "",
            _TOKEN_FORMAT,
            message=f"{source}: an entry is not {_TOKEN_FORMAT}",
        )
    name, token, scope_text = (p.strip() for p in parts)
    if not _NAME.match(name):
        raise TaskValidationError(f"{source} name", name, "1-64 of A-Z a-z 0-9 _ . @ -")
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise TaskValidationError(
            f"{source} token",
            f"{name}:***",
            f"at least {MIN_TOKEN_LENGTH} characters without spaces",
            message=f"{source}: the token of {name!r} must be at least {MIN_TOKEN_LENGTH} "
            "characters without spaces",
        )
    scopes = {s.strip() for s in scope_text.split("+") if s.strip()}
    if ALL_SCOPES in scopes:
        scopes = set(SCOPES)
    unknown = scopes - set(SCOPES)
    if not scopes or unknown:
        raise TaskValidationError(f"{source} scopes", scope_text, [*SCOPES, ALL_SCOPES])
    return ApiToken(name=name, token=token, scopes=frozenset(scopes))


def parse_tokens(specs: Iterable[str], *, source: str = TOKENS_ENV) -> tuple[ApiToken, ...]:
    tokens = tuple(parse_token_spec(s, source=source) for s in specs if s.strip())
    _check_unique(tokens, source)
    return tokens


def _check_unique(tokens: Iterable[ApiToken], source: str) -> None:
    names: set[str] = set()
    values: set[str] = set()
    for token in tokens:
        if token.name in names:
            raise TaskValidationError(f"{source} name", token.name, "unique token names")
        if token.token in values:
            raise TaskValidationError(
                f"{source} token", f"{token.name}:***", "a different token for every name"
            )
        names.add(token.name)
        values.add(token.token)


def read_tokens_file(path: str | Path) -> tuple[ApiToken, ...]:
    source = f"{TOKENS_FILE_ENV} ({path})"
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise TaskValidationError(
            TOKENS_FILE_ENV, str(path), "a readable file", message=f"{source}: {exc}"
        ) from exc
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return parse_tokens(lines, source=source)


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    addresses = {str(info[4][0]).split("%", 1)[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


@dataclass(frozen=True)
class HttpConfig:
    """What the HTTP service needs beyond the store and the registry.

    ``tokens``: when any is configured, every route but ``/healthz`` needs one. ``allowed_hosts``:
    the ``Host`` header values accepted (port ignored); None means the loopback names when no
    token is configured (a defence against DNS rebinding of an open local service) and any host
    otherwise. ``session_secret`` signs dashboard sessions; None draws a random one, so sessions
    end when the service restarts. ``heartbeat_ttl_s`` decides which workers count as live.
    ``auth_limits``: how many failed authentications a client may make before it waits
    (``taskward.web.throttle``).
    """

    tokens: tuple[ApiToken, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    allowed_hosts: tuple[str, ...] | None = None
    session_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    session_ttl_s: float = 12 * 3600.0
    secure_cookies: bool = False
    heartbeat_ttl_s: float = 90.0
    retry_after_s: int = 5
    dashboard_poll_s: float = 2.0
    auth_limits: FailureLimits = field(default_factory=FailureLimits)
    # Proxies whose X-Forwarded-For names the client (TASKWARD_TRUSTED_PROXIES). None by default:
    # the peer address is the client, so a local caller cannot pick the address the
    # failed-authentication limit counts by sending a forwarded header (uvicorn alone trusts
    # 127.0.0.1 by default).
    trusted_proxies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_unique(self.tokens, "tokens")
        if self.max_body_bytes < 1:
            raise TaskValidationError("max_body_bytes", self.max_body_bytes, "an integer >= 1")
        limits = self.auth_limits
        for name, value, least in (
            (AUTH_MAX_FAILURES_ENV, limits.max_failures, 1),
            (AUTH_WINDOW_ENV, limits.window_s, 1),
            (AUTH_BLOCK_ENV, limits.block_s, 1),
            (AUTH_MAX_BLOCK_ENV, limits.max_block_s, limits.block_s),
            ("auth_limits.max_clients", limits.max_clients, 1),
        ):
            if not (value >= least and math.isfinite(value)):  # also refuses NaN
                raise TaskValidationError(name, value, f"a finite number >= {least:g}")

    @property
    def auth_required(self) -> bool:
        return bool(self.tokens)

    def check_listen_address(self, host: str) -> None:
        """Refuse to serve a non-loopback address without a token (DESIGN.md Bindings).

        Raises:
            TaskValidationError: ``host`` is not loopback and no token is configured.
        """
        if not self.tokens and not is_loopback(host):
            raise TaskValidationError(
                "--host",
                host,
                "a loopback address (127.0.0.1, ::1, localhost) unless API tokens are configured",
                message=f"refusing to listen on {host!r} without an API token: anyone who can "
                "reach it could submit and cancel tasks. Configure tokens "
                f"({TOKENS_ENV}='name:token:submit+read+operate' or --api-tokens-file), "
                "or listen on 127.0.0.1",
            )

    def accepted_hosts(self) -> tuple[str, ...] | None:
        """Host names to accept, or None for any."""
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        return None if self.tokens else LOOPBACK_HOSTS

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, tokens_file: str | None = None
    ) -> HttpConfig:
        """Read tokens (``TASKWARD_API_TOKENS``, ``TASKWARD_API_TOKENS_FILE`` or
        ``tokens_file``), ``TASKWARD_HTTP_MAX_BODY_BYTES``, ``TASKWARD_SESSION_SECRET`` and the
        failed-authentication limits (``TASKWARD_AUTH_*``) and ``TASKWARD_TRUSTED_PROXIES``."""
        env = os.environ if environ is None else environ
        tokens = list(parse_tokens(env.get(TOKENS_ENV, "").split(",")))
        path = tokens_file or env.get(TOKENS_FILE_ENV, "").strip()
        if path:
            tokens.extend(read_tokens_file(path))
        _check_unique(tokens, "API tokens")
        max_body = env.get(MAX_BODY_ENV, "").strip()
        try:
            max_body_bytes = int(max_body) if max_body else DEFAULT_MAX_BODY_BYTES
        except ValueError:
            raise TaskValidationError(MAX_BODY_ENV, max_body, "an integer >= 1") from None
        defaults = FailureLimits()
        auth_limits = FailureLimits(
            max_failures=int(_number(env, AUTH_MAX_FAILURES_ENV, defaults.max_failures, int)),
            window_s=_number(env, AUTH_WINDOW_ENV, defaults.window_s, float),
            block_s=_number(env, AUTH_BLOCK_ENV, defaults.block_s, float),
            max_block_s=_number(env, AUTH_MAX_BLOCK_ENV, defaults.max_block_s, float),
        )
        proxies = tuple(p.strip() for p in env.get(TRUSTED_PROXIES_ENV, "").split(",") if p.strip())
        config = cls(
            tokens=tuple(tokens),
            max_body_bytes=max_body_bytes,
            auth_limits=auth_limits,
            trusted_proxies=proxies,
        )
        secret = env.get(SESSION_SECRET_ENV, "")
        if secret:
            config = dataclasses.replace(config, session_secret=secret.encode("utf-8"))
        return config


def _number(
    env: Mapping[str, str], name: str, default: float, kind: type[int] | type[float]
) -> float:
    """The number in ``env[name]`` (``default`` when unset or blank)."""
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise TaskValidationError(name, text, f"a number ({kind.__name__})") from None
