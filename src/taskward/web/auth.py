"""Bearer-token access: who is calling (a Principal) and whether a scope allows the call.

Tokens are compared in constant time against every configured token (no early exit, and over
SHA-256 digests so their lengths do not leak). The token's name becomes the ``Actor``
(``operator:<name>``) of the transitions its requests cause. Scopes: ``submit``, ``read``,
``operate``; capability labels are routing hints, never permissions (ADR-0072 out of scope).

A client whose tokens keep failing is answered 429 for a while (``taskward.web.throttle``):
the limit is checked before any token is compared, and only failures count.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from taskward.models import Actor
from taskward.web.config import SCOPES, ApiToken, HttpConfig
from taskward.web.problems import ApiProblem
from taskward.web.state import services_of
from taskward.web.throttle import client_key

ANONYMOUS: Final = "anonymous"

bearer_scheme = HTTPBearer(
    auto_error=False,
    description="An API token (`TASKWARD_API_TOKENS`); required on every route but /healthz "
    "once any token is configured.",
)


@dataclass(frozen=True)
class Principal:
    """The caller: a configured token's name and scopes, or the anonymous local user."""

    name: str
    scopes: frozenset[str]

    def actor(self) -> Actor:
        return Actor(type="operator", id=self.name)

    def allows(self, scope: str) -> bool:
        return scope in self.scopes


def anonymous() -> Principal:
    """Every scope: only possible when no token is configured (and so only on loopback)."""
    return Principal(ANONYMOUS, frozenset(SCOPES))


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


def find_token(config: HttpConfig, presented: str) -> ApiToken | None:
    """The configured token equal to ``presented``, compared in constant time with all."""
    wanted = _digest(presented)
    match: ApiToken | None = None
    for token in config.tokens:
        if hmac.compare_digest(_digest(token.token), wanted):
            match = token
    return match


def principal_for_token(config: HttpConfig, name: str) -> Principal | None:
    """The principal of the token named ``name`` as configured now (None if it is gone)."""
    for token in config.tokens:
        if token.name == name:
            return Principal(token.name, token.scopes)
    return None


def _unauthorized(detail: str, error: str) -> ApiProblem:
    return ApiProblem(
        401,
        "unauthorized",
        "Unauthorized",
        detail,
        headers={"WWW-Authenticate": f'Bearer realm="taskward", error="{error}"'},
    )


def principal_from_header(config: HttpConfig, authorization: str | None) -> Principal:
    """Authenticate an ``Authorization`` header; raises a 401 ApiProblem."""
    if not config.auth_required:
        return anonymous()
    if not authorization:
        raise _unauthorized(
            "an API token is required: Authorization: Bearer <token>", "invalid_request"
        )
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise _unauthorized("use Authorization: Bearer <token>", "invalid_request")
    token = find_token(config, credentials.strip())
    if token is None:
        raise _unauthorized("the API token is not valid", "invalid_token")
    return Principal(token.name, token.scopes)


def client_of(request: Request) -> str:
    """The failure limiter's key for the caller: its peer address (``scope["client"]``). Only
    uvicorn's trusted-proxy setting (``--forwarded-allow-ips``) rewrites that from
    ``X-Forwarded-For``; the header itself is never read here."""
    return client_key(request.client.host if request.client else None)


def too_many_failures(retry_after_s: int) -> ApiProblem:
    return ApiProblem(
        429,
        "too-many-auth-failures",
        "Too many failed authentications",
        f"too many failed authentications from this address; retry after {retry_after_s} s",
        headers={"Retry-After": str(retry_after_s)},
        retry_after_s=retry_after_s,
    )


def authenticate(request: Request) -> Principal:
    """The request's principal. A client over the failure limit gets a 429 ApiProblem before
    its token is compared (not even a correct token passes: that would tell a guesser which
    guess was right); a presented token that fails is counted and gets a 401. A request that
    presents no token is neither counted nor blocked: it guesses nothing."""
    services = services_of(request)
    config = services.config
    authorization = request.headers.get("authorization")
    if not config.auth_required or not authorization:
        return principal_from_header(config, authorization)
    client = client_of(request)
    wait = services.auth_limiter.retry_after(client)
    if wait is not None:
        raise too_many_failures(wait)
    try:
        return principal_from_header(config, authorization)
    except ApiProblem:
        services.auth_limiter.failed(client)
        raise


def check_scope(principal: Principal, scope: str) -> None:
    """Raise a 403 ApiProblem unless ``principal`` holds ``scope``."""
    if not principal.allows(scope):
        raise ApiProblem(
            403,
            "forbidden",
            "Forbidden",
            f"token {principal.name!r} lacks the {scope!r} scope",
            required_scope=scope,
            scopes=sorted(principal.scopes),
        )


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    """A FastAPI dependency: the authenticated principal, which must hold ``scope``."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; scopes: {', '.join(SCOPES)}")

    async def dependency(
        request: Request,
        _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    ) -> Principal:
        principal = authenticate(request)
        check_scope(principal, scope)
        return principal

    return dependency
