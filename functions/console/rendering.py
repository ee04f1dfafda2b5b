"""How a console page answers: its template with what every page needs, or a refusal as a page.

`render` adds the context every page shares (the CSRF token, whether this
visitor may write, `may` for each form's route, the dev clock control) and the headers every page
sends: no caching, no framing (a confirmation page in another site's frame
could be clicked through), and a content security policy that lets only
the console's own scripts run. `ConsolePage` is the route class of the
console's routers: a client's mistake (a bad key, a value the database
refuses, a missing run) becomes a page saying so with the status
`functions.http.errors` gives it, never a JSON body or a 500. The filters
format what pages show: times relative to the database's clock (which
`duly dev` can move), durations, JSON.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import ValidationError
from sqlalchemy.exc import DataError
from starlette.routing import Match

from engine import ConfigurationError, DulyError, json_value
from functions.console.auth import LoginRequired, can_write, console_auth, remember_browser
from functions.console.templating import templates
from functions.http.errors import message_of, status_of
from functions.http.segments import RawPathRoute, sent_path
from functions.http.state import connection_of
from functions.identity.access import PUBLIC, declared_role, principal_in, refusal
from functions.identity.principal import Role
from functions.requests.errors import problems_of

__all__ = ["connection_of"]  # the pages' way to the workflow connection, beside render

# Scripts only from the console's own folder (htmx, console.js); styles may sit in attributes
# (the bars of a chart are sized there); no page of another site may frame a console page.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
MAX_SHOWN_TEXT = 2000  # characters of one value shown in a table cell


def render(
    request: Request,
    name: str,
    context: Mapping[str, Any] | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    """The template `name` with every page's shared context and headers."""
    auth = console_auth(request)
    shared = {
        "writable": can_write(request),
        "may": functools.partial(may_send, request),
        "login_required": auth.login_required,
        "dev_clock": bool(getattr(request.app.state, "console_clock", False)),
        "path": sent_path(request.scope),  # as sent: a key's encoded `/` kept
    }
    response = templates.TemplateResponse(
        request, name, {**shared, **(context or {})}, status_code=status_code
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    remember_browser(request, response)  # its forms' CSRF token, before any session
    return response


def may_send(request: Request, method: str, path: str) -> bool:
    """Whether this visitor may send `method path` (as a form's URL encodes it): the least role
    the route declares (its `allow`), judged by the rule the route itself applies, so a page
    offers only the forms its visitor may use."""
    principal = principal_in(request.scope)
    if principal is None:
        return False
    # Matched as encoded: a key's `%2F` stays inside its segment, as RawPathRoute keeps it.
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for context in iter_route_contexts(request.app.router.routes):
        route = context.route
        if not isinstance(route, APIRoute) or context.matches(scope)[0] is not Match.FULL:
            continue
        role = declared_role(route)
        if role is None or role == PUBLIC:
            return role == PUBLIC
        return refusal(principal, Role(role), method, unquote(path)) is None
    return False


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """A client's mistake, as a page with its status."""
    titles = {404: "Not found", 401: "Log in first", 403: "Refused"}
    context = {"title": titles.get(status, "Not done"), "status": status, "message": message}
    return render(request, "error.html", context, status_code=status)


def problem_of(exc: Exception) -> tuple[int, str]:
    """The status and sentence a page shows for an error a client caused."""
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    if isinstance(exc, RequestValidationError | ValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid"}
        where = ".".join(str(part) for part in first["loc"] if part not in ("query", "path"))
        return 400, f"{where or 'The request'}: {first['msg']}."
    if problems_of(exc) is not None:  # a form's values, as the API places them: a 400 page
        return 400, message_of(exc)
    return status_of(exc), message_of(exc)


CLIENT_MISTAKES = (DulyError, DataError, RequestValidationError, ValidationError)


class ConsolePage(RawPathRoute):
    """A console route: a client's mistake is a page saying so, never JSON or a 500.

    Matched on the raw path, so a run key or event id with `/` reaches its own page.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired:
                raise  # a redirect to the login form, answered by FastAPI
            except HTTPException as exc:
                if exc.status_code >= 500:
                    raise
                return error_page(request, *problem_of(exc))
            except CLIENT_MISTAKES as exc:
                if isinstance(exc, ConfigurationError):
                    raise  # the deployment's mistake, not the visitor's: a logged 500
                return error_page(request, *problem_of(exc))

        return page


# -- filters ---------------------------------------------------------------------------------


def relative(moment: datetime | None, now: datetime | None) -> str:
    """`moment` from `now`, in words: "in 3 days", "2 minutes ago", "now"."""
    if moment is None:
        return "—"
    if now is None:
        return absolute(moment)
    seconds = (moment - now).total_seconds()
    ahead = seconds >= 0
    span = abs(seconds)
    if span < 1:
        return "now"
    words = _two_units(int(span))
    return f"in {words}" if ahead else f"{words} ago"


UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def _two_units(seconds: int) -> str:
    """A span in its largest unit and the next: "2 days 23 hours", "4 minutes 5 seconds"."""
    parts: list[tuple[int, str]] = []
    for unit, size in UNITS:
        count, seconds = divmod(seconds, size)
        if count or parts:
            parts.append((count, unit))
        if len(parts) == 2:
            break
    return " ".join(f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in parts if n)


def absolute(moment: datetime | str | None) -> str:
    """A time (or its ISO 8601 text) as people read it, in UTC, to the second."""
    if moment is None:
        return "—"
    return as_datetime(moment).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(moment: datetime | str | None) -> str:
    """A time in ISO 8601, for `<time datetime>`."""
    return as_datetime(moment).isoformat() if moment is not None else ""


def as_datetime(moment: datetime | str) -> datetime:
    """A time, from itself or from the ISO 8601 text a JSON document holds."""
    return moment if isinstance(moment, datetime) else datetime.fromisoformat(moment)


def duration(ms: float | None) -> str:
    """A step's time: milliseconds below a second, seconds above."""
    if ms is None:
        return "—"
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.1f} ms"
    return f"{ms / 1000:.2f} s"


def shift_text(shift: timedelta) -> str:
    """A clock shift as people say it: "+3 days 2 hours", "none"."""
    seconds = int(shift.total_seconds())
    if seconds == 0:
        return "none"
    sign = "+" if seconds > 0 else "-"
    return sign + _two_units(abs(seconds))


def pretty(value: Any) -> str:
    """A value as indented JSON (times in ISO 8601)."""
    return json.dumps(json_value(value), indent=2, sort_keys=True, ensure_ascii=False)


def cell(value: Any) -> str:
    """A value for a table cell: text as it is, anything else as compact JSON, shortened."""
    if value is None:
        return "—"
    plain = json_value(value)  # times become ISO text, shown without quotes
    text = plain if isinstance(plain, str) else json.dumps(plain, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN_TEXT else text[: MAX_SHOWN_TEXT - 1] + "…"


def number(value: int | None) -> str:
    """A count with thousands separated."""
    return "—" if value is None else f"{value:,}"


templates.env.filters.update(
    relative=relative,
    absolute=absolute,
    iso=iso,
    duration=duration,
    pretty=pretty,
    cell=cell,
    number=number,
    shift_text=shift_text,
)
templates.env.globals["relative"] = relative
