"""Configuration of the HTTP service: API tokens with scopes, the body limit, hosts, sessions.

Tokens come from ``TASKWARD_API_TOKENS`` (``name:token:scope+scope,...``) and/or the file named by
``TASKWARD_API_TOKENS_FILE`` (one ``name:token:scopes`` a line; ``#`` starts a comment). Scopes
are ``submit``, ``read`` and ``operate`` (cancel, outbox retry, schedule fire/enable/disable);
``*`` grants all three. Capability labels are routing hints and never appear here.
``HttpConfig.from_env`` builds the config from ``taskward.web.settings`` (the variables); this
module owns the token line format and the invariants however a config is made.
"""

from __future__ import annotations

import ipaddress
import math
import re
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from taskward.errors import TaskValidationError
from taskward.web.settings import DEFAULT_MAX_BODY_BYTES, ENV_PREFIX, read_settings
from taskward.web.throttle import FailureLimits

SCOPES: Final[tuple[str, ...]] = ("submit", "read", "operate")
ALL_SCOPES: Final = "*"
MIN_TOKEN_LENGTH: Final = 16
TOKENS_ENV: Final = f"{ENV_PREFIX}API_TOKENS"
TOKENS_FILE_ENV: Final = f"{ENV_PREFIX}API_TOKENS_FILE"
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


def _new_secret() -> bytes:
    """A random session secret: sessions end when the service restarts."""
    return secrets.token_bytes(32)


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
    session_secret: bytes = field(default_factory=_new_secret, repr=False)
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
            (f"{ENV_PREFIX}AUTH_MAX_FAILURES", limits.max_failures, 1),
            (f"{ENV_PREFIX}AUTH_FAILURE_WINDOW_S", limits.window_s, 1),
            (f"{ENV_PREFIX}AUTH_BLOCK_S", limits.block_s, 1),
            (f"{ENV_PREFIX}AUTH_MAX_BLOCK_S", limits.max_block_s, limits.block_s),
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
        """Read the ``TASKWARD_*`` settings (``taskward.web.settings``): tokens
        (``TASKWARD_API_TOKENS``, ``TASKWARD_API_TOKENS_FILE`` or ``tokens_file``), the body
        limit, the session secret, the failed-authentication limits and the trusted proxies.

        Raises:
            TaskValidationError: a value is invalid; ``field`` names its variable.
        """
        settings = read_settings(environ)
        tokens = list(parse_tokens(settings.api_tokens.get_secret_value().split(",")))
        path = tokens_file or settings.api_tokens_file.strip()
        if path:
            tokens.extend(read_tokens_file(path))
        _check_unique(tokens, "API tokens")
        secret = settings.session_secret
        return cls(
            tokens=tuple(tokens),
            max_body_bytes=settings.http_max_body_bytes,
            session_secret=secret.get_secret_value().encode("utf-8") if secret else _new_secret(),
            auth_limits=FailureLimits(
                max_failures=settings.auth_max_failures,
                window_s=settings.auth_failure_window_s,
                block_s=settings.auth_block_s,
                max_block_s=settings.auth_max_block_s,
            ),
            trusted_proxies=settings.trusted_proxies,
        )
