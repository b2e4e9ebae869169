"""ASGI guards in front of every route: the request-body limit, the Host allowlist and the
cross-origin check for state-changing requests.

- A body over the limit is refused with 413 before anything parses it: at once from
  ``Content-Length``, else while reading (the body is buffered up to the limit, never past it).
- With no token configured, only loopback ``Host`` names are accepted, so a web page cannot
  reach an open local service through DNS rebinding.
- A browser marks cross-site requests (``Origin``, ``Sec-Fetch-Site``); a state-changing one
  from another origin is refused, so no page can submit or cancel through a visitor's browser.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskward.web.problems import problem_response

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            text: str = value.decode("latin-1")
            return text
    return None


def host_name(authority: str) -> str:
    """``"[::1]:8080"`` -> ``"::1"``; ``"localhost:80"`` -> ``"localhost"``."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    if authority.count(":") == 1:
        return authority.split(":", 1)[0]
    return authority


class RequestGuards:
    """Pure ASGI middleware (no body parsing of its own beyond counting bytes)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        accepted_hosts: Iterable[str] | None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.accepted_hosts = (
            None if accepted_hosts is None else frozenset(h.lower() for h in accepted_hosts)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        host = _header(scope, b"host") or ""
        if self.accepted_hosts is not None and host_name(host) not in self.accepted_hosts:
            response = problem_response(
                400,
                "host-not-allowed",
                "Host not allowed",
                f"Host {host_name(host)!r} is not served; allowed: "
                f"{', '.join(sorted(self.accepted_hosts))} (configure API tokens to serve "
                "other names)",
                instance=path,
            )
            await response(scope, receive, send)
            return
        method = scope.get("method", "GET")
        if method in _BODY_METHODS:
            refusal = self._cross_origin(scope, host)
            if refusal is not None:
                response = problem_response(
                    403, "cross-origin", "Cross-origin request refused", refusal, instance=path
                )
                await response(scope, receive, send)
                return
            await self._with_limited_body(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _cross_origin(scope: Scope, host: str) -> str | None:
        if (_header(scope, b"sec-fetch-site") or "").lower() == "cross-site":
            return "a state-changing request from another site is refused"
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        if origin == "null" or urlsplit(origin).netloc.lower() != host.strip().lower():
            return f"Origin {origin!r} does not match Host {host!r}"
        return None

    def _too_large(self, path: str) -> ASGIApp:
        return problem_response(
            413,
            "body-too-large",
            "Request body too large",
            f"the request body is over the limit of {self.max_body_bytes} bytes",
            instance=path,
            max_body_bytes=self.max_body_bytes,
        )

    async def _with_limited_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        declared = _header(scope, b"content-length")
        if (
            declared is not None
            and declared.strip().isdigit()
            and int(declared) > self.max_body_bytes
        ):
            await self._too_large(path)(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(path)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
