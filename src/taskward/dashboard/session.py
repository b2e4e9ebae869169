"""Dashboard sessions and CSRF protection.

A session is an HMAC-signed cookie (``HttpOnly``, ``SameSite=Strict``) naming the token it
logged in with, a random session id, its CSRF token and its expiry. The token's current scopes
are looked up on every request, so removing a token from the configuration ends its sessions.
With no token configured, everyone on the (loopback-only) service gets an anonymous session on
first visit.

Logging out revokes the session server-side: its id goes into the store's ``revoked_sessions``
(migration 0010), which every request with a session consults, so a copy of the cookie is
refused by every service process sharing the store, and after a restart. A row is kept only
until the session would have expired anyway (each logout purges the expired ones), so the table
holds at most the logouts of one session lifetime. Anonymous sessions are not recorded: they
grant nothing a visitor of the loopback-only service does not get anyway.

Every state-changing form carries the session's CSRF token in a hidden field (or the
``X-CSRF-Token`` header); it must equal the one in the signed cookie. Together with
``SameSite=Strict`` and the cross-origin guard, no other site can cancel through a visitor.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Final

from fastapi import Request
from fastapi.responses import Response

from taskward.store import StateDB
from taskward.web.auth import ANONYMOUS, Principal, anonymous, principal_for_token
from taskward.web.config import HttpConfig
from taskward.web.state import services_of

SESSION_COOKIE: Final = "taskward_session"
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "x-csrf-token"


@dataclass(frozen=True)
class Session:
    name: str
    csrf: str
    expires_at: float
    id: str  # random; what a logout revokes (never the CSRF token, which pages carry)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, payload.encode("ascii"), hashlib.sha256).digest())


def encode_session(secret: bytes, session: Session) -> str:
    payload = _b64(
        json.dumps(
            {"n": session.name, "c": session.csrf, "e": session.expires_at, "i": session.id},
            separators=(",", ":"),
        ).encode("utf-8")
    )
    return f"{payload}.{_sign(secret, payload)}"


def decode_session(secret: bytes, value: str, *, now: float) -> Session | None:
    """The session in a cookie value, or None if it is forged, malformed or expired."""
    payload, _, signature = value.partition(".")
    try:
        if not hmac.compare_digest(_sign(secret, payload), signature):
            return None
        data = json.loads(_unb64(payload))
        session = Session(
            name=str(data["n"]),
            csrf=str(data["c"]),
            expires_at=float(data["e"]),
            id=str(data["i"]),  # a cookie from before session ids: log in again
        )
    except (ValueError, KeyError, TypeError, UnicodeError):
        return None
    return session if session.expires_at > now else None


def new_session(config: HttpConfig, name: str) -> Session:
    return Session(
        name=name,
        csrf=secrets.token_urlsafe(24),
        expires_at=time.time() + config.session_ttl_s,
        id=secrets.token_urlsafe(16),
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
    session = decode_session(config.session_secret, value, now=time.time())
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
    by ``decode_session`` anyway; so the table never grows past one session lifetime of logouts.
    """
    async with db.transaction(now=time.time()) as tx:
        await tx.execute("session_revocations_purge")
        await tx.execute(
            "session_revoke", {"session_id": session.id, "expires_at": session.expires_at}
        )


def set_session_cookie(config: HttpConfig, response: Response, session: Session) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        encode_session(config.session_secret, session),
        max_age=int(config.session_ttl_s),
        httponly=True,
        samesite="strict",
        secure=config.secure_cookies,
        path="/",
    )


def clear_session_cookie(config: HttpConfig, response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=config.secure_cookies
    )


def csrf_matches(session: Session, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(
        session.csrf.encode("utf-8"), (presented or "").encode("utf-8")
    )
