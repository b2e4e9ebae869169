"""Dashboard sessions and CSRF protection, signed by ``itsdangerous``.

A session is a cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` when configured, path
``/``) holding a ``URLSafeTimedSerializer`` document under the session salt: the token name it
logged in with, a random session id and a random CSRF nonce. Its signed timestamp and
``max_age=session_ttl_s`` decide expiry; a forged, malformed or expired cookie is no session.
The token's current scopes are looked up on every request, so removing a token from the
configuration ends its sessions. With no token configured, everyone on the (loopback-only)
service gets an anonymous session on first visit.

Logging out revokes the session server-side: its id goes into the store's ``revoked_sessions``
(migration 0010), which every request with a session consults, so a copy of the cookie is
refused by every service process sharing the store, and after a restart. A row is kept only
until the session would have expired anyway (each logout purges the expired ones), so the table
holds at most the logouts of one session lifetime. Anonymous sessions are not recorded: they
grant nothing a visitor of the loopback-only service does not get anyway.

Every state-changing form carries a CSRF token in a hidden field (or the ``X-CSRF-Token``
header): the session's nonce signed under the CSRF salt, so it is bound to that session, and
neither kind of document can stand in for the other. Together with ``SameSite=Strict`` and the
cross-origin guard, no other site can cancel through a visitor. Signatures are checked in
constant time (itsdangerous), and so is the nonce. The secret is never logged or shown.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Final

from fastapi import Request
from fastapi.responses import Response
from itsdangerous import BadData, URLSafeTimedSerializer

from taskward.store import StateDB
from taskward.web.auth import ANONYMOUS, Principal, anonymous, principal_for_token
from taskward.web.config import HttpConfig
from taskward.web.state import services_of

SESSION_COOKIE: Final = "taskward_session"
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "x-csrf-token"
# One salt per purpose: a CSRF token is never a valid session cookie, nor the reverse.
SESSION_SALT: Final = "taskward.dashboard.session"
CSRF_SALT: Final = "taskward.dashboard.csrf"


@dataclass(frozen=True)
class Session:
    name: str
    csrf: str  # random nonce; pages carry it signed (csrf_token), the cookie carries it too
    expires_at: float
    id: str  # random; what a logout revokes (never the CSRF nonce, which pages carry)


def _signer(config: HttpConfig, salt: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(config.session_secret, salt=salt)


def _ttl_s(config: HttpConfig) -> int:
    return int(config.session_ttl_s)


def new_session(config: HttpConfig, name: str) -> Session:
    return Session(
        name=name,
        csrf=secrets.token_urlsafe(24),
        expires_at=time.time() + config.session_ttl_s,
        id=secrets.token_urlsafe(16),
    )


def read_session(config: HttpConfig, value: str) -> Session | None:
    """The session in a cookie value, or None if it is forged, malformed or expired."""
    try:
        data, signed_at = _signer(config, SESSION_SALT).loads(
            value, max_age=_ttl_s(config), return_timestamp=True
        )
        return Session(
            name=str(data["n"]),
            csrf=str(data["c"]),
            expires_at=signed_at.timestamp() + config.session_ttl_s,
            id=str(data["i"]),
        )
    except (BadData, KeyError, TypeError):
        return None


def csrf_token(config: HttpConfig, session: Session) -> str:
    """The CSRF token a page of ``session`` carries in its forms."""
    return _signer(config, CSRF_SALT).dumps(session.csrf)


def csrf_matches(config: HttpConfig, session: Session, presented: str | None) -> bool:
    """True when ``presented`` is a CSRF token of ``session`` (signed, unexpired, its nonce)."""
    if not presented:
        return False
    try:
        nonce = _signer(config, CSRF_SALT).loads(presented, max_age=_ttl_s(config))
    except BadData:
        return False
    return isinstance(nonce, str) and hmac.compare_digest(
        nonce.encode("utf-8"), session.csrf.encode("utf-8")
    )


async def session_principal(
    config: HttpConfig, request: Request
) -> tuple[Session, Principal] | None:
    """The request's valid session and whom it stands for, or None: the cookie is signed and
    unexpired, its token is still configured and it was not logged out (``revoked_sessions``
    in the request's store). Raises StoreError while the store cannot say."""
    value = request.cookies.get(SESSION_COOKIE)
    if not value:
        return None
    session = read_session(config, value)
    if session is None:
        return None
    if not config.auth_required:
        return session, anonymous()
    if session.name == ANONYMOUS:
        return None  # made before tokens were configured
    principal = principal_for_token(config, session.name)
    if principal is None:
        return None
    db = await services_of(request).store.get()
    if await db.fetchone("session_revoked", {"session_id": session.id}) is not None:
        return None
    return session, principal


async def revoke_session(db: StateDB, session: Session) -> None:
    """Refuse ``session`` from now on in every process on ``db``; drop expired revocations.

    Invariant: a row lives until its session's own expiry, after which the cookie is refused
    by ``read_session`` anyway; so the table never grows past one session lifetime of logouts.
    """
    async with db.transaction(now=time.time()) as tx:
        await tx.execute("session_revocations_purge")
        await tx.execute(
            "session_revoke", {"session_id": session.id, "expires_at": session.expires_at}
        )


def set_session_cookie(config: HttpConfig, response: Response, session: Session) -> None:
    value = _signer(config, SESSION_SALT).dumps(
        {"n": session.name, "i": session.id, "c": session.csrf}
    )
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=_ttl_s(config),
        httponly=True,
        samesite="strict",
        secure=config.secure_cookies,
        path="/",
    )


def clear_session_cookie(config: HttpConfig, response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=config.secure_cookies
    )
