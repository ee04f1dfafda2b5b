"""The console's ways in and out: the issuer's login, a typed key or token, and the logout.

`GET /console/login` offers "Log in with <issuer>" (when DULY_OIDC_CLIENT_ID is
set) and a field for a named API key or DULY_API_TOKEN. The issuer's way
goes to `/console/login/oidc`, which sends the person to the issuer with a
flow kept in the short-lived `duly_oidc` cookie, and back to
`/console/login/callback`, whose query (the one-time code and the state) the
access log never shows. Wrong credentials are slowed per client address
(`Throttle`). `POST /console/logout` ends the session on the server.
"""

from __future__ import annotations

import base64
import binascii
import logging
from datetime import datetime
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from functions.console.auth import (
    CALLBACK_PATH,
    CONSOLE_PREFIX,
    LOGIN_PATH,
    SESSION_COOKIE,
    console_auth,
    drop_cookie,
    is_https,
    remember_browser,
    safe_next,
    session_of,
    set_cookie,
)
from functions.console.sessions import (
    SESSION_SECONDS,
    SessionTooLate,
    end_session,
    start_session,
)
from functions.console.templating import templates
from functions.http.guard import client_of
from functions.identity.access import allow, principal_in
from functions.identity.oidc_login import MAX_CODE, LoginFlow, authorization_url, finish
from functions.identity.principal import Principal, Via
from functions.identity.roles import CredentialRefused

FLOW_COOKIE = "duly_oidc"  # a login at the issuer under way: its secret and where to go next
FLOW_SECONDS = 10 * 60  # how long a person may take at the issuer
MAX_TYPED = 1000  # characters typed into the login form
MAX_NEXT = 2000  # characters of the page to go on to

ACCESS_LOGGER = "uvicorn.access"  # (client, method, path with query, version, status)


class CallbackQueryHidden(logging.Filter):
    """Logs the callback's path without its query: its code and state open a login."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 2 and isinstance(args[2], str):
            path, mark, _ = args[2].partition("?")
            if mark and path.endswith(CALLBACK_PATH):
                record.args = (*args[:2], path, *args[3:])
        return True


# Whatever server runs the app (`duly dev`, uvicorn by hand), its access log hides them.
logging.getLogger(ACCESS_LOGGER).addFilter(CallbackQueryHidden())
router = APIRouter()


@router.get("/login", response_class=HTMLResponse, dependencies=[allow(None)])
async def login_form(
    request: Request, next: Annotated[str | None, Query(max_length=MAX_NEXT)] = None
) -> HTMLResponse:
    """The login page: the issuer's button, and the field for a key or token."""
    return login_page(request, safe_next(next))


@router.post("/login", dependencies=[allow(None)])
async def log_in(
    request: Request,
    token: Annotated[str, Form(max_length=MAX_TYPED)] = "",
    next: Annotated[str, Form(max_length=MAX_NEXT)] = CONSOLE_PREFIX,
) -> Response:
    """Start a session for a named API key or DULY_API_TOKEN; the form again, refused, if not."""
    auth = console_auth(request)
    target = safe_next(next)
    waiting = _throttled(request, target)
    if waiting is not None:
        return waiting
    principal = auth.typed_principal(token.strip())
    if principal is None:
        auth.throttle.failed(client_of(request.scope))
        message = (
            "That is neither a key of DULY_API_KEYS nor DULY_API_TOKEN."
            if auth.token is not None or auth.keys.keys
            else "No API key or token is configured here, so there is nothing to type."
        )
        return login_page(request, target, message, status_code=401)
    return await _signed_in(request, principal, target, auth.credential_of(token.strip()))


@router.get("/login/oidc", dependencies=[allow(None)])
async def log_in_at_issuer(
    request: Request, next: Annotated[str | None, Query(max_length=MAX_NEXT)] = None
) -> Response:
    """Send the person to the issuer, the flow's secret kept in the `duly_oidc` cookie."""
    verifier = console_auth(request).oidc_login
    target = safe_next(next)
    if verifier is None:
        message = "No DULY_OIDC_CLIENT_ID is set here, so the console logs in at no issuer."
        return login_page(request, target, message, status_code=404)
    flow = LoginFlow.new()
    try:
        url = await authorization_url(verifier, _redirect_uri(request), flow)
    except CredentialRefused as refused:
        return login_page(request, target, f"The issuer cannot be used. {refused}", 503)
    response = RedirectResponse(url, status_code=303)
    set_cookie(request, response, FLOW_COOKIE, f"{flow.secret}.{_encoded(target)}", FLOW_SECONDS)
    return response


@router.get("/login/callback", dependencies=[allow(None)])
async def issuer_callback(
    request: Request,
    code: Annotated[str | None, Query(max_length=MAX_CODE)] = None,
    state: Annotated[str | None, Query(max_length=200)] = None,
    error: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Where the issuer sends the person back: the code traded, a session started."""
    verifier = console_auth(request).oidc_login
    secret, _, encoded = request.cookies.get(FLOW_COOKIE, "").partition(".")
    target = safe_next(_decoded(encoded))
    if verifier is None:
        return login_page(request, target, "This console logs in at no issuer.", 404)
    if error is not None or code is None or state is None:
        return login_page(request, target, "The issuer did not log you in.", 401)
    if not secret:
        message = "This login began in another browser or took too long: log in again."
        return login_page(request, target, message, status_code=400)
    waiting = _throttled(request, target)
    if waiting is not None:
        return waiting
    try:
        login = await finish(verifier, LoginFlow(secret), state, code, _redirect_uri(request))
    except CredentialRefused as refused:
        console_auth(request).throttle.failed(client_of(request.scope))
        return login_page(request, target, f"The login was refused. {refused}", 401)
    response = await _signed_in(request, login.principal, target, until=login.expires)
    drop_cookie(request, response, FLOW_COOKIE)
    return response


@router.post("/logout", dependencies=[allow(None)])
async def log_out(request: Request) -> Response:
    """End the session on the server (its cookie opens nothing after) and go to the login."""
    found = session_of(request)
    if found is not None:
        await end_session(request.app.state.connection.engine, found.secret)
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    drop_cookie(request, response, SESSION_COOKIE)
    return response


async def _signed_in(
    request: Request,
    principal: Principal,
    target: str,
    credential: str | None = None,
    until: datetime | None = None,
) -> Response:
    if not principal.roles:
        message = f"{principal.shown} holds no role here (DULY_ROLES, DULY_DEFAULT_ROLE)."
        return login_page(request, target, message, status_code=403)
    engine = request.app.state.connection.engine
    previous = session_of(request)
    if previous is not None:  # logging in again: the session this browser had ends
        await end_session(engine, previous.secret)
    try:
        started = await start_session(engine, principal, credential, until)
    except SessionTooLate:
        message = "The issuer's ID token has expired already: log in again."
        return login_page(request, target, message, status_code=401)
    response = RedirectResponse(target, status_code=303)
    set_cookie(request, response, SESSION_COOKIE, started.secret, SESSION_SECONDS)
    return response


def _throttled(request: Request, target: str) -> Response | None:
    """The 429 page when this client spent its free misses, with Retry-After; else None."""
    wait = console_auth(request).throttle.wait(client_of(request.scope))
    if wait is None:
        return None
    seconds = max(1, round(wait + 0.5))
    message = f"Too many wrong logins from here: try again in {seconds} seconds."
    response = login_page(request, target, message, status_code=429)
    response.headers["Retry-After"] = str(seconds)
    return response


def _acting_via(request: Request) -> Via | None:
    acting = principal_in(request.scope)
    return acting.via if acting is not None else None


def _redirect_uri(request: Request) -> str:
    """The callback's absolute URL, as the browser reaches this app."""
    scheme = "https" if is_https(request) else request.url.scheme
    return f"{scheme}://{request.url.netloc}{CALLBACK_PATH}"


def _encoded(target: str) -> str:
    return base64.urlsafe_b64encode(target.encode()).decode().rstrip("=")


def _decoded(encoded: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def login_page(
    request: Request, target: str, error: str | None = None, status_code: int = 200
) -> HTMLResponse:
    """The login page, with `error` when a try was refused."""
    auth = console_auth(request)
    verifier = auth.oidc_login
    context = {
        "title": "Log in",
        "next": target,
        "error": error,
        "login_required": auth.login_required,
        "console_open": _acting_via(request) == Via.OPEN,
        "typed_login": auth.token is not None or bool(auth.keys.keys),
        "issuer": urlsplit(verifier.settings.issuer).netloc if verifier is not None else None,
    }
    response = templates.TemplateResponse(request, "login.html", context, status_code=status_code)
    response.headers["Cache-Control"] = "no-store"
    remember_browser(request, response)
    return response
