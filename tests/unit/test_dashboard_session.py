"""Dashboard session cookies and CSRF tokens (``taskward.dashboard.session``, itsdangerous):
the cookie's attributes, forgery and expiry, one salt per purpose, the CSRF token bound to its
session, and the secret kept out of reprs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest
from fastapi.responses import Response

from taskward.dashboard.session import (
    SESSION_COOKIE,
    csrf_matches,
    csrf_token,
    new_session,
    read_session,
    set_session_cookie,
)
from taskward.web.config import HttpConfig

SECRET = b"s" * 32
CONFIG = HttpConfig(session_secret=SECRET, session_ttl_s=3600.0)


def cookie_of(config: HttpConfig, name: str = "alice") -> tuple[str, str]:
    """(the cookie's value, its whole Set-Cookie header) for a new session of ``name``."""
    response = Response()
    set_session_cookie(config, response, new_session(config, name))
    header = response.headers["set-cookie"]
    value = header.split(";", 1)[0].removeprefix(f"{SESSION_COOKIE}=")
    return value, header


def test_the_cookie_is_http_only_strict_and_secure_when_configured() -> None:
    _, header = cookie_of(CONFIG)
    attributes = {part.strip().split("=")[0].lower() for part in header.split(";")[1:]}
    assert {"httponly", "max-age", "path"} <= attributes and "secure" not in attributes
    assert "samesite=strict" in header.lower() and "Path=/" in header and "Max-Age=3600" in header
    _, secure = cookie_of(HttpConfig(session_secret=SECRET, secure_cookies=True))
    assert "; secure" in secure.lower()


def test_a_cookie_reads_back_as_its_session() -> None:
    response = Response()
    session = new_session(CONFIG, "alice")
    set_session_cookie(CONFIG, response, session)
    value = response.headers["set-cookie"].split(";", 1)[0].split("=", 1)[1]
    read = read_session(CONFIG, value)
    assert read is not None
    assert (read.name, read.id, read.csrf) == (session.name, session.id, session.csrf)
    assert abs(read.expires_at - session.expires_at) < 2


def test_a_forged_or_foreign_cookie_is_no_session() -> None:
    value, _ = cookie_of(CONFIG)
    payload, _, signature = value.rpartition(".")
    assert read_session(CONFIG, f"{payload}.{'A' * len(signature)}") is None
    assert read_session(HttpConfig(session_secret=b"t" * 32), value) is None
    for junk in ("", ".", "nonsense", "a.b.c", value[:-1]):
        assert read_session(CONFIG, junk) is None


def test_a_cookie_of_the_hand_signed_format_is_no_session() -> None:
    """Sessions made before itsdangerous signed them log in again (CHANGELOG)."""
    data = {"n": "alice", "c": "c", "e": time.time() + 60, "i": "i"}
    payload = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    digest = hmac.new(SECRET, payload.encode(), hashlib.sha256).digest()
    signature = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    assert read_session(CONFIG, f"{payload}.{signature}") is None


def test_a_cookie_expires_after_the_session_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    value, _ = cookie_of(CONFIG)
    signed = time.time()
    monkeypatch.setattr(time, "time", lambda: signed + 3590)
    assert read_session(CONFIG, value) is not None
    monkeypatch.setattr(time, "time", lambda: signed + 3602)
    assert read_session(CONFIG, value) is None


def test_the_csrf_token_is_bound_to_its_session() -> None:
    session, other = new_session(CONFIG, "alice"), new_session(CONFIG, "alice")
    token = csrf_token(CONFIG, session)
    assert token != session.csrf  # signed, not the bare nonce
    assert csrf_matches(CONFIG, session, token)
    assert not csrf_matches(CONFIG, other, token)
    assert not csrf_matches(HttpConfig(session_secret=b"t" * 32), session, token)
    for presented in (None, "", "guess", session.csrf, token[:-1]):
        assert not csrf_matches(CONFIG, session, presented)


def test_a_csrf_token_and_a_session_cookie_never_stand_in_for_each_other() -> None:
    response = Response()
    session = new_session(CONFIG, "alice")
    set_session_cookie(CONFIG, response, session)
    cookie = response.headers["set-cookie"].split(";", 1)[0].split("=", 1)[1]
    assert read_session(CONFIG, csrf_token(CONFIG, session)) is None
    assert not csrf_matches(CONFIG, session, cookie)


def test_the_secret_is_not_in_the_config_repr() -> None:
    assert repr(SECRET)[2:-1] not in repr(CONFIG) and "session_secret" not in repr(CONFIG)
