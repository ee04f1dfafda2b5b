"""Who is using the console: the session a login started, and the CSRF token of every form.

With any credential configured (DULY_API_TOKEN, DULY_API_KEYS, DULY_OIDC_ISSUER) every page
needs a session (`functions.console.sessions`; the login pages are `functions.console.login`);
with none, the console is open. Every write carries `csrf_token` (a form field, or the
`X-CSRF-Token` header): an HMAC of the session's cookie secret, or before a session of the
browser's `duly_login` secret, which the app's `Guard` has `refused_write` check. Template globals:
`csrf_token`, `signed_in`, `signed_in_as`. Why it is shaped so: docs/architecture.md, "The console".
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import cookie_parser

from functions.console.sessions import SESSION_SECONDS, Session, find_session, session_principal
from functions.console.templating import templates
from functions.http.segments import sent_path
from functions.identity.access import PRINCIPAL_SCOPE, principal_in
from functions.identity.authenticate import Credentials
from functions.identity.keys import KeyRing
from functions.identity.oidc import OidcVerifier
from functions.identity.principal import Principal, Via
from functions.identity.throttle import Throttle

CONSOLE_PREFIX = "/console"
LOGIN_PATH = "/console/login"
OIDC_START_PATH = "/console/login/oidc"
CALLBACK_PATH = "/console/login/callback"
LOGOUT_PATH = "/console/logout"
# Pages anyone may open, signed in or not: the ways in and out.
LOGIN_PATHS = frozenset({LOGIN_PATH, OIDC_START_PATH, CALLBACK_PATH, LOGOUT_PATH})
SESSION_COOKIE = "duly_session"  # the session's random secret; the table keeps its SHA-256
BROWSER_COOKIE = "duly_login"  # a random secret of a browser without a session: its forms' CSRF
BROWSER_SECONDS = SESSION_SECONDS
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
CSRF_CONTEXT = b"duly console csrf v1"
MAX_SECRET = 100  # characters of a cookie's secret worth reading
FORM_TYPE = "application/x-www-form-urlencoded"
SESSION_SCOPE = "duly.console_session"  # the request's session, once looked up (None: none)
BROWSER_SCOPE = "duly.console_browser"  # the browser's secret, and whether it is new


class ConsoleAuth:
    """The console's credentials and rules, made once per app from the app's settings."""

    def __init__(
        self,
        credentials: Credentials,
        oidc: OidcVerifier | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.credentials = credentials
        self.oidc = oidc
        self.throttle = throttle or Throttle()

    @classmethod
    def of(cls, credentials: Credentials) -> ConsoleAuth:
        """The console of the app whose guard takes `credentials`: the same token, keys and
        issuer (one verifier, so one key cache)."""
        verifier = credentials.oidc
        return cls(credentials, verifier if isinstance(verifier, OidcVerifier) else None)

    @property
    def token(self) -> str | None:
        """DULY_API_TOKEN, the admin key."""
        return self.credentials.token

    @property
    def keys(self) -> KeyRing:
        """The named API keys."""
        return self.credentials.keys

    @property
    def login_required(self) -> bool:
        """Whether every page needs a session (a token, a key or an issuer is configured)."""
        return self.token is not None or bool(self.keys.keys) or self.oidc is not None

    @property
    def oidc_login(self) -> OidcVerifier | None:
        """The issuer people log in at, when the console has a client there."""
        return self.oidc if self.oidc is not None and self.oidc.settings.client_id else None

    def typed_principal(self, typed: str) -> Principal | None:
        """The principal a typed DULY_API_TOKEN or named API key names; None for anything else."""
        return self.credentials.typed(typed)

    def credential_of(self, typed: str) -> str | None:
        """What a session keeps of the key or token typed to start it: the key's SHA-256, or
        an HMAC of the token (which never leaves this process)."""
        if self.token is not None and hmac.compare_digest(typed.encode(), self.token.encode()):
            return _token_digest(self.token)
        key = self.keys.find(typed)
        return key.sha256 if key is not None else None

    def still_held(self, found: Session) -> Session | None:
        """`found` while its credential is still configured, its roles as they are now: a
        key's from its entry, an issuer's user's from DULY_ROLES by the user and groups its
        token named. None once its key is removed or rotated, the token changed, the issuer
        is gone, or its user holds no role any more."""
        if found.credential is None:
            return self._issuer_held(found)
        if self.token is not None and hmac.compare_digest(
            found.credential, _token_digest(self.token)
        ):
            return found
        for key in self.keys.keys:
            if hmac.compare_digest(found.credential, key.sha256):
                return Session(found.secret, session_principal(key.principal()), found.credential)
        return None

    def _issuer_held(self, found: Session) -> Session | None:
        if found.way != Via.OIDC or self.oidc is None:
            return None
        was = found.principal
        roles = self.credentials.roles.user_roles(was.id, was.groups)
        if not roles:
            return None
        return replace(found, principal=replace(was, roles=roles))

    async def session(self, scope: Any, headers: Mapping[str, str]) -> Session | None:
        """The request's good session, looked up once per request (kept in its scope)."""
        if SESSION_SCOPE in scope:
            found: Session | None = scope[SESSION_SCOPE]
            return found
        found = None
        if self.login_required:
            secret = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE)
            if secret:
                found = await find_session(engine_of(scope), secret)
                found = None if found is None else self.still_held(found)
        scope[SESSION_SCOPE] = found
        return found

    async def principal(self, scope: Any, headers: Mapping[str, str]) -> Principal | None:
        """The principal of the request's session cookie; None without a good session."""
        found = await self.session(scope, headers)
        return found.principal if found is not None else None

    def owns(self, path: str) -> bool:
        """Whether `path` is the console's (the guard leaves its writes to this class)."""
        return is_console_path(path)

    def open_to_all(self, path: str) -> bool:
        """Whether anyone may open `path`: the ways in (the login pages) and out (the logout)."""
        return path in LOGIN_PATHS

    async def write_refusal(
        self, scope: Any, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, str] | None:
        """Why a console write may not go on, as (status, sentence); None when it may."""
        found = await self.session(scope, headers)
        browser = cookie_parser(headers.get("cookie", "")).get(BROWSER_COOKIE)
        given = headers.get(CSRF_HEADER) or _form_field(headers, body, CSRF_FIELD)
        if scope["path"] in LOGIN_PATHS:
            # Logging in or out: the form a browser was given, with or without a session.
            good = [csrf_of(s) for s in (browser, found.secret if found else None) if s]
            matched = given and any(hmac.compare_digest(given.encode(), g.encode()) for g in good)
            return None if matched else _stale_form()
        # Whoever the guard named (the session's principal, a bearer's, or LOCAL when
        # nothing is configured) acts; with nobody, the write is refused.
        if principal_in(scope) is None and found is None:
            if self.login_required:
                return 401, "Log in to the console first: your session is missing or has ended."
            return 403, (
                "The console writes as the one who logged in, and nobody can log in here: set "
                "DULY_API_TOKEN, DULY_API_KEYS or DULY_OIDC_ISSUER to act from it."
            )
        expected = csrf_of(found.secret if found is not None else browser)
        if not given or not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            return _stale_form()
        return None

    async def refused_write(
        self, scope: Any, headers: Mapping[str, str], body: bytes
    ) -> HTMLResponse | None:
        """The page refusing a console write (`write_refusal`), or None when it may go on."""
        refused = await self.write_refusal(scope, headers, body)
        return None if refused is None else refusal_page(*refused, scope)


def engine_of(scope: Any) -> AsyncEngine:
    """The database engine of the app serving `scope` (its workflow connection's)."""
    engine: AsyncEngine = scope["app"].state.connection.engine
    return engine


def csrf_of(secret: str | None) -> str:
    """The CSRF token of the forms given to the holder of a cookie's secret ("" for none)."""
    if not secret:
        return ""
    return hmac.new(secret.encode(), CSRF_CONTEXT, hashlib.sha256).hexdigest()


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
    context = {
        "title": "Not done",
        "status": status,
        "message": detail,
        "login": status == 401,
        "path": sent_path(scope),
    }
    response = templates.TemplateResponse(request, "error.html", context, status_code=status)
    remember_browser(request, response)
    return response


# -- the request's view of it ------------------------------------------------------------------


def console_auth(request: Request) -> ConsoleAuth:
    """The app's ConsoleAuth (made by `functions.app.create_app`)."""
    auth: ConsoleAuth = request.app.state.console_auth
    return auth


def session_of(request: Request) -> Session | None:
    """The request's good session, as `require_reader` (or the guard) looked it up."""
    found: Session | None = request.scope.get(SESSION_SCOPE)
    return found


def browser_secret(request: Request) -> str:
    """The browser's `duly_login` secret: its cookie's, or a new one `remember_browser` sets."""
    known = request.scope.get(BROWSER_SCOPE)
    if known is None:
        given = request.cookies.get(BROWSER_COOKIE, "")
        fresh = not (0 < len(given) <= MAX_SECRET)
        known = (secrets.token_urlsafe(32) if fresh else given, fresh)
        request.scope[BROWSER_SCOPE] = known
    secret: str = known[0]
    return secret


def remember_browser(request: Request, response: Response) -> None:
    """Set the `duly_login` cookie on a page whose forms were given a new browser secret."""
    known = request.scope.get(BROWSER_SCOPE)
    if known is not None and known[1]:
        set_cookie(request, response, BROWSER_COOKIE, known[0], BROWSER_SECONDS)


def set_cookie(request: Request, response: Response, name: str, value: str, seconds: int) -> None:
    """One of the console's cookies: HttpOnly, SameSite=Lax, Secure over https.

    Lax, not Strict: the issuer sends the person back to the callback from another site,
    and a Strict cookie is left out of that request and of its redirect on. A page of
    another site still cannot post with them: every write needs the CSRF token.
    """
    response.set_cookie(
        name,
        value,
        max_age=seconds,
        path="/",
        httponly=True,
        samesite="lax",
        secure=is_https(request),
    )


def drop_cookie(request: Request, response: Response, name: str) -> None:
    """Remove one of the console's cookies."""
    response.delete_cookie(name, path="/", httponly=True, samesite="lax", secure=is_https(request))


def is_https(request: Request) -> bool:
    """Whether the browser reached the app over https (directly, or through a proxy)."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def csrf_token(request: Request) -> str:
    """The CSRF token this request's forms carry."""
    found = session_of(request)
    return csrf_of(found.secret if found is not None else browser_secret(request))


def signed_in(request: Request) -> bool:
    """Whether the request has a good session."""
    return session_of(request) is not None


def signed_in_as(request: Request) -> Principal | None:
    """Who the request's session is, for the header."""
    found = session_of(request)
    return found.principal if found is not None else None


def can_write(request: Request) -> bool:
    """Whether this visitor's console forms can write (someone is acting: open, or signed in)."""
    return principal_in(request.scope) is not None or signed_in(request)


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a console path, never another site."""
    if target and is_console_path(target.split("?")[0]) and not target.startswith("//"):
        return target
    return CONSOLE_PREFIX


class LoginRequired(HTTPException):
    """A page that needs a session: a redirect to the login form (or htmx's HX-Redirect)."""


async def require_reader(request: Request) -> None:
    """Every console page's dependency: the session looked up, and, when one is needed and
    there is none, a redirect to the login form (the login pages are free)."""
    auth = console_auth(request)
    found = await auth.session(request.scope, request.headers)
    if found is not None and principal_in(request.scope) is None:
        request.scope[PRINCIPAL_SCOPE] = found.principal  # no guard named one
    # With nothing configured the guard names everyone LOCAL, so the pages are open.
    if principal_in(request.scope) is not None or request.url.path in LOGIN_PATHS:
        return
    target = sent_path(request.scope) + (f"?{request.url.query}" if request.url.query else "")
    login = f"{LOGIN_PATH}?{urlencode({'next': target})}"
    if request.headers.get("hx-request"):
        raise LoginRequired(401, "Log in to the console first.", headers={"HX-Redirect": login})
    raise LoginRequired(303, "Log in to the console first.", headers={"Location": login})


templates.env.globals["csrf_token"] = csrf_token
templates.env.globals["signed_in"] = signed_in
templates.env.globals["signed_in_as"] = signed_in_as
templates.env.globals["csrf_field_name"] = CSRF_FIELD


def _token_digest(token: str) -> str:
    return hmac.new(token.encode(), b"duly console session", hashlib.sha256).hexdigest()
