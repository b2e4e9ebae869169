"""What every dashboard response shares: templates, security headers, the navigation, forms.

Every response carries a strict Content-Security-Policy (scripts only from ``/static``), so task
data that looks like HTML or script stays text; Jinja autoescapes everything it renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from taskward.dashboard.session import Session, csrf_token, set_session_cookie
from taskward.web.auth import Principal
from taskward.web.state import services_of

CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes Chrome send Origin: null
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
MAX_FORM_BYTES: Final = 16 * 1024
# Fields a form may repeat (a list's selection boxes): their values come joined by spaces.
REPEATED_FIELDS: Final = frozenset({"task_id"})
MAX_FORM_FIELDS: Final = 80

templates = Environment(
    loader=PackageLoader("taskward.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)

NAV: Final = (
    ("/", "overview"),
    ("/tasks", "tasks"),
    ("/workers", "workers"),
    ("/schedules", "schedules"),
    ("/limits", "limits"),
    ("/outbox", "outbox"),
)


def secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def safe_next(value: str | None) -> str:
    """Only a path on this site (never ``//host`` or a scheme) is followed after login."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    parts = urlsplit(value)
    return value if not parts.scheme and not parts.netloc else "/"


def html(
    request: Request,
    template: str,
    *,
    session: Session | None,
    principal: Principal | None,
    new_cookie: Session | None = None,
    status_code: int = 200,
    **context: Any,
) -> Response:
    services = services_of(request)
    body = templates.get_template(template).render(
        nav=NAV,
        path=request.url.path,
        csrf=csrf_token(services.config, session) if session else "",
        who=principal.name if principal else None,
        can_operate=bool(principal and principal.allows("operate")),
        auth_required=services.config.auth_required,
        poll_ms=int(services.config.dashboard_poll_s * 1000),
        **context,
    )
    response = HTMLResponse(body, status_code=status_code)
    if new_cookie is not None:
        set_session_cookie(services.config, response, new_cookie)
    return secure(response)


async def read_form(request: Request) -> Mapping[str, str]:
    """An urlencoded form body (small; the app's body limit applies first). A field named in
    ``REPEATED_FIELDS`` keeps every value, joined by spaces; any other keeps its first."""
    raw = await request.body()
    if len(raw) > MAX_FORM_BYTES:
        return {}
    try:
        parsed = parse_qs(
            raw.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS
        )
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: " ".join(v) if k in REPEATED_FIELDS else v[0] for k, v in parsed.items() if v}


def forbidden(request: Request, message: str) -> Response:
    return html(
        request,
        "message.html",
        session=None,
        principal=None,
        status_code=403,
        title="Forbidden",
        message=message,
    )
