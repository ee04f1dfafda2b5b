"""Who may use the console: the API's token, typed once into a login form, and a CSRF token.

With `DULY_API_TOKEN` set, every page needs the `duly_session` cookie the login form sets:
a time and a nonce signed with a key derived from the token (never the token), so changing
the token ends every session. Every write carries `csrf_token` (a form field, or the
`X-CSRF-Token` header), an HMAC of the session's nonce, which the app's `Guard` checks
(`write_refusal`). `csrf_token(request)` and `signed_in(request)` are template globals.
Who may do what without a token: docs/architecture.md, "The console".
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.requests import cookie_parser

from functions.console.templating import templates
from functions.http.segments import sent_path
from functions.identity.access import allow, principal_in
from functions.identity.authenticate import ADMIN_TOKEN_ID
from functions.identity.principal import Principal, Role, Via

CONSOLE_PREFIX = "/console"
LOGIN_PATH = "/console/login"
LOGOUT_PATH = "/console/logout"
SESSION_COOKIE = "duly_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SESSION_SECONDS = 12 * 60 * 60  # a session's life
CLOCK_SKEW = 60  # seconds a session's time may be ahead of this server's
REFUSED_LOGIN_PAUSE = 0.25  # seconds a wrong token waits: guessing gets slow
KEY_CONTEXT = b"duly console v1"  # what the signing key is derived for
MAX_TOKEN = 1000  # characters typed into the login form
FORM_TYPE = "application/x-www-form-urlencoded"


class ConsoleAuth:
    """The console's keys and rules, made once per app from the API's own settings."""

    def __init__(self, token: str | None, secret: str | None) -> None:
        self.token = token
        self.secret = secret
        material = token if token is not None else secret
        # Without either, a key of this process: its tokens are good until it restarts.
        self._key = (
            hmac.new(KEY_CONTEXT, material.encode(), hashlib.sha256).digest()
            if material is not None
            else secrets.token_bytes(32)
        )

    @property
    def login_required(self) -> bool:
        """Whether every page needs a session (a token is set)."""
        return self.token is not None

    @property
    def writes_open(self) -> bool:
        """Whether writes need no session (neither a token nor a secret is set: local dev)."""
        return self.token is None and self.secret is None

    def _mac(self, *parts: str) -> str:
        message = "\0".join(parts).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def new_session(self, now: float | None = None) -> str:
        """A session cookie's value: its time, a nonce, and their signature."""
        issued = str(int(time.time() if now is None else now))
        nonce = secrets.token_urlsafe(18)
        return f"{issued}.{nonce}.{self._mac('session', issued, nonce)}"

    def session_nonce(self, cookie: str | None, now: float | None = None) -> str | None:
        """The nonce of a good, unexpired session cookie; None for anything else."""
        if not cookie or self.token is None:
            return None
        issued, _, rest = cookie.partition(".")
        nonce, _, mac = rest.partition(".")
        if not issued.isdigit() or not nonce or not mac:
            return None
        if not hmac.compare_digest(mac.encode(), self._mac("session", issued, nonce).encode()):
            return None
        age = (time.time() if now is None else now) - int(issued)
        return nonce if -CLOCK_SKEW <= age <= SESSION_SECONDS else None

    def csrf_for(self, nonce: str | None) -> str:
        """The CSRF token of the forms a session (or, before one, anyone) is given."""
        return self._mac("csrf", nonce or "")

    def token_matches(self, typed: str) -> bool:
        """Whether `typed` is DULY_API_TOKEN (always False when none is set)."""
        if self.token is None:
            return False
        return hmac.compare_digest(typed.encode(), self.token.encode())

    def write_refusal(
        self, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, str] | None:
        """Why a console write may not go on, as (status, sentence); None when it may."""
        cookies = cookie_parser(headers.get("cookie", ""))
        nonce = self.session_nonce(cookies.get(SESSION_COOKIE))
        given = headers.get(CSRF_HEADER) or _form_field(headers, body, CSRF_FIELD)
        if path in (LOGIN_PATH, LOGOUT_PATH):
            # Before a session, the token every login form carries; a logout, either.
            good = {self.csrf_for(None), self.csrf_for(nonce)}
            return None if given in good else _stale_form()
        if self.login_required and nonce is None:
            return 401, "Log in to the console first: your session is missing or has ended."
        if not self.writes_open and self.token is None:
            return 403, (
                "The console writes with DULY_API_TOKEN, and only DULY_WEBHOOK_SECRET is set: "
                "set the token to act from the console."
            )
        if not given or not hmac.compare_digest(given.encode(), self.csrf_for(nonce).encode()):
            return _stale_form()
        return None

    def owns(self, path: str) -> bool:
        """Whether `path` is the console's (the guard leaves its writes to this class)."""
        return is_console_path(path)

    def open_to_all(self, path: str) -> bool:
        """Whether anyone may open `path`: the login form and the logout."""
        return path in (LOGIN_PATH, LOGOUT_PATH)

    async def principal(self, scope: Any, headers: Mapping[str, str]) -> Principal | None:
        """The principal of a good session: the token's admin, logged in through the form."""
        cookies = cookie_parser(headers.get("cookie", ""))
        if self.session_nonce(cookies.get(SESSION_COOKIE)) is None:
            return None
        return Principal(id=ADMIN_TOKEN_ID, roles=frozenset({Role.ADMIN}), via=Via.SESSION)

    def refused_write(
        self, scope: Any, headers: Mapping[str, str], body: bytes
    ) -> HTMLResponse | None:
        """The page refusing a console write (`write_refusal`), or None when it may go on."""
        refused = self.write_refusal(scope["path"], headers, body)
        return None if refused is None else refusal_page(*refused, scope)


def _stale_form() -> tuple[int, str]:
    return 403, (
        "This form's CSRF token is missing or out of date (did the session change?): "
        "reload the page and send it again."
    )


def _form_field(headers: Mapping[str, str], body: bytes, name: str) -> str | None:
    """One field of a URL-encoded form body, or None."""
    if not headers.get("content-type", "").startswith(FORM_TYPE):
        return None
    try:
        values = parse_qs(body.decode("utf-8"), keep_blank_values=True).get(name)
    except UnicodeDecodeError:
        return None
    return values[0] if values else None


def is_console_path(path: str) -> bool:
    """Whether a request's path is the console's."""
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


def refusal_page(status: int, detail: str, scope: Any) -> HTMLResponse:
    """A refused console write, as a page a person can read."""
    request = Request(scope)
    context = {"title": "Not done", "status": status, "message": detail, "login": status == 401}
    return templates.TemplateResponse(request, "error.html", context, status_code=status)


# -- the request's view of it ------------------------------------------------------------------


def console_auth(request: Request) -> ConsoleAuth:
    """The app's ConsoleAuth (made by `functions.http.app.create_app`)."""
    auth: ConsoleAuth = request.app.state.console_auth
    return auth


def session_of(request: Request) -> str | None:
    """The nonce of the request's good session, or None."""
    return console_auth(request).session_nonce(request.cookies.get(SESSION_COOKIE))


def csrf_token(request: Request) -> str:
    """The CSRF token this request's forms carry."""
    return console_auth(request).csrf_for(session_of(request))


def signed_in(request: Request) -> bool:
    """Whether the request has a good session."""
    return session_of(request) is not None


def can_write(request: Request) -> bool:
    """Whether this visitor's console forms can write (open, or signed in)."""
    auth = console_auth(request)
    return auth.writes_open or (auth.token is not None and signed_in(request))


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a console path, never another site."""
    if target and is_console_path(target.split("?")[0]) and not target.startswith("//"):
        return target
    return CONSOLE_PREFIX


class LoginRequired(HTTPException):
    """A page that needs a session: a redirect to the login form (or htmx's HX-Redirect)."""


async def require_reader(request: Request) -> None:
    """Every console page's dependency: with a token set, a session (the login form is free)."""
    if request.url.path == LOGIN_PATH or principal_in(request.scope) is not None:
        return
    target = sent_path(request.scope) + (f"?{request.url.query}" if request.url.query else "")
    login = f"{LOGIN_PATH}?{urlencode({'next': target})}"
    if request.headers.get("hx-request"):
        raise LoginRequired(401, "Log in to the console first.", headers={"HX-Redirect": login})
    raise LoginRequired(303, "Log in to the console first.", headers={"Location": login})


templates.env.globals["csrf_token"] = csrf_token
templates.env.globals["signed_in"] = signed_in
templates.env.globals["csrf_field_name"] = CSRF_FIELD


# -- the login form ------------------------------------------------------------------------------

router = APIRouter()


@router.get("/login", response_class=HTMLResponse, dependencies=[allow(None)])
async def login_form(
    request: Request, next: Annotated[str | None, Query(max_length=2000)] = None
) -> HTMLResponse:
    """The form where DULY_API_TOKEN is typed."""
    return _login_page(request, safe_next(next))


@router.post("/login", dependencies=[allow(None)])
async def log_in(
    request: Request,
    token: Annotated[str, Form(max_length=MAX_TOKEN)] = "",
    next: Annotated[str, Form(max_length=2000)] = CONSOLE_PREFIX,
) -> Response:
    """Start a session when the token is DULY_API_TOKEN; the form again, refused, if not."""
    auth = console_auth(request)
    target = safe_next(next)
    if not auth.token_matches(token):
        await asyncio.sleep(REFUSED_LOGIN_PAUSE)
        message = (
            "That is not the API's token (DULY_API_TOKEN)."
            if auth.login_required
            else "No DULY_API_TOKEN is set here, so there is nothing to log in with."
        )
        return _login_page(request, target, message, status_code=401)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        auth.new_session(),
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=_https(request),
    )
    return response


@router.post("/logout", dependencies=[allow(None)])
async def log_out(request: Request) -> Response:
    """End the session (the cookie is dropped) and go to the login form."""
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=_https(request)
    )
    return response


def _login_page(
    request: Request, target: str, error: str | None = None, status_code: int = 200
) -> HTMLResponse:
    auth = console_auth(request)
    context = {
        "title": "Log in",
        "next": target,
        "error": error,
        "login_required": auth.login_required,
        "writes_open": auth.writes_open,
    }
    return templates.TemplateResponse(request, "login.html", context, status_code=status_code)


def _https(request: Request) -> bool:
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"
