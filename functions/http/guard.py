"""Who is calling, before any route runs: every request's principal, and the body's limits.

With no credential configured (local development) everyone is `LOCAL`, and
a write a browser sends from another site is refused. Otherwise every
request but the public ones (`/healthz`, static assets, the console's login)
needs a credential, checked before its body is read: a bearer token
(`functions.identity.authenticate`), a Lambda Function URL's IAM caller, the
console's session, or a signature of the request. Wrong bearer tokens are
slowed per client (429). Bodies are bounded in size (413) and time (408).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse

from engine import settings as variables
from functions.http.bodies import (
    BodyRefused,
    Limits,
    bounded,
    read_body,
    replayed,
    too_large_signed,
)
from functions.identity.access import PRINCIPAL_SCOPE
from functions.identity.authenticate import Credentials
from functions.identity.principal import LOCAL, Principal
from functions.identity.roles import CredentialRefused
from functions.identity.signatures import (
    DIGITS,
    MAX_SIGNED_BODY,
    SIGNATURE_HEADER,
    DatabaseClock,
    Signers,
    check_fresh,
)
from functions.identity.throttle import Throttle

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

FOREIGN_WRITE = (
    "Nothing here asks for a credential (no DULY_API_TOKEN, key, issuer or secret), so a page "
    "of another site may not write: this request's Origin is not this server."
)
UNDECLARED_LENGTH = (
    "A signed request declares its body's length (Content-Length): it is read before its "
    "sender is known."
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PUBLIC_PATHS = frozenset({"/healthz"})


class ConsoleGate(Protocol):
    """What the guard asks the console (`ConsoleAuth`) of a request to one of its pages."""

    def owns(self, path: str) -> bool:
        """Whether `path` is one of the console's."""
        ...

    def open_to_all(self, path: str) -> bool:
        """Whether `path` is a console page anyone may open (the login form)."""
        ...

    async def principal(self, scope: Scope, headers: Mapping[str, str]) -> Principal | None:
        """The principal of the request's console session, or None."""
        ...

    async def refused_write(
        self, scope: Scope, headers: Mapping[str, str], body: bytes
    ) -> ASGIApp | None:
        """The page that refuses this write, or None when it may go on."""
        ...


@dataclass(frozen=True)
class GuardSettings:
    """The credentials taken, the public paths, and the limits on any request's body."""

    credentials: Credentials = field(default_factory=Credentials)
    signers: Signers = field(default_factory=Signers)
    max_body_bytes: int = variables.MAX_BODY_BYTES.default
    body_timeout: float = variables.BODY_TIMEOUT_SECONDS.default
    public_prefixes: tuple[str, ...] = ()  # static assets: the same for everyone

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, public_prefixes: tuple[str, ...] = ()
    ) -> GuardSettings:
        """Every credential variable, DULY_MAX_BODY_BYTES and DULY_BODY_TIMEOUT_SECONDS."""
        return cls(
            credentials=Credentials.from_env(environ),
            signers=Signers.from_env(environ),
            max_body_bytes=variables.MAX_BODY_BYTES.read(environ),
            body_timeout=variables.BODY_TIMEOUT_SECONDS.read(environ),
            public_prefixes=public_prefixes,
        )

    @property
    def token(self) -> str | None:
        """DULY_API_TOKEN, the admin key."""
        return self.credentials.token

    @property
    def secret(self) -> str | None:
        """A signing secret (DULY_WEBHOOK_SECRET first): the console's keys derive from it
        when no token is set."""
        return self.signers.secrets[0].secret if self.signers else None

    @property
    def open(self) -> bool:
        """Whether nothing asks for a credential (local development)."""
        return not self.credentials.configured and not self.signers

    def public(self, path: str) -> bool:
        """Whether anyone may call `path` (health, static assets)."""
        return path in PUBLIC_PATHS or path.startswith(self.public_prefixes)


class Refusal(Exception):
    """A request the guard answers itself: its status, sentence and headers."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


class Guard:
    """Names each request's principal (`scope[PRINCIPAL_SCOPE]`) or refuses it; pure ASGI.

    A body is counted and timed as it arrives and never read past its limit;
    only a signed request's body is read here (its signature covers it), once
    its head holds (`_signed_head`), and a console write's (its CSRF token may
    be a form field).
    """

    def __init__(
        self, app: ASGIApp, settings: GuardSettings, console: ConsoleGate | None = None
    ) -> None:
        self.app = app
        self.settings = settings
        self.console = console
        self.throttle = Throttle()
        self.clock = DatabaseClock()  # a signature's window, checked before its body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limits = Limits(self.settings.max_body_bytes, self.settings.body_timeout)
        try:
            body = await self._admit(scope, headers, receive, limits)
        except (Refusal, BodyRefused) as refused:
            extra = getattr(refused, "headers", None)
            await _refuse(scope, receive, send, refused.status, refused.detail, extra)
            return
        if self._console_write(scope):
            if body is None:
                body = await _read_or_refuse(scope, receive, send, limits)
                if body is None:
                    return
            assert self.console is not None
            refusal = await self.console.refused_write(scope, headers, body)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        passed = bounded(receive, limits) if body is None else replayed(body, receive)
        await self.app(scope, passed, send)

    def _console_write(self, scope: Scope) -> bool:
        return (
            self.console is not None
            and scope["method"] not in SAFE_METHODS
            and self.console.owns(scope["path"])
        )

    async def _admit(
        self, scope: Scope, headers: Mapping[str, str], receive: Receive, limits: Limits
    ) -> bytes | None:
        """Put the request's principal in its scope, or raise its Refusal; the body if read."""
        _check_length(headers, limits)
        settings, path = self.settings, scope["path"]
        if settings.open:
            if scope["method"] not in SAFE_METHODS and _from_another_site(headers):
                raise Refusal(403, FOREIGN_WRITE)
            scope[PRINCIPAL_SCOPE] = settings.credentials.iam(scope) or LOCAL
            return None
        if settings.public(path):
            return None
        if self.console is not None and self.console.open_to_all(path):
            found = await self.console.principal(scope, headers)  # a logout has a session
            if found is not None:
                scope[PRINCIPAL_SCOPE] = found
            return None
        principal, body = await self._principal(scope, headers, receive, limits)
        if principal is not None:
            scope[PRINCIPAL_SCOPE] = principal
        elif self.console is None or not self.console.owns(path):
            raise Refusal(401, _unauthenticated(settings), {"WWW-Authenticate": "Bearer"})
        return body  # a console page without a session: the console sends it to the login

    async def _principal(
        self, scope: Scope, headers: Mapping[str, str], receive: Receive, limits: Limits
    ) -> tuple[Principal | None, bytes | None]:
        # An AWS_IAM Function URL verified the caller's SigV4 signature and hands it on in the
        # Authorization header: the platform's word comes first, so that header is no bearer.
        caller = self.settings.credentials.iam(scope)
        if caller is not None:
            return caller, None
        authorization = headers.get("authorization")
        if authorization is not None:
            return await self._bearer(scope, authorization), None
        if SIGNATURE_HEADER in headers and self.settings.signers:
            await self._signed_head(scope, headers, limits)
            body = await read_body(receive, limits)
            return await self._signed(scope, headers, body), body
        if self.console is not None and (
            scope["method"] in SAFE_METHODS or self.console.owns(scope["path"])
        ):
            return await self.console.principal(scope, headers), None
        return None, None

    async def _bearer(self, scope: Scope, authorization: str) -> Principal:
        client = client_of(scope)
        wait = self.throttle.wait(client)
        if wait is not None:
            raise Refusal(
                429,
                f"Too many wrong credentials from this address: try again in {wait:.0f} s.",
                {"Retry-After": str(max(int(wait + 0.999), 1))},
            )
        scheme, _, presented = authorization.partition(" ")
        presented = presented.strip()
        try:
            if scheme.lower() != "bearer" or not presented:
                raise CredentialRefused("Authorization must be `Bearer <token>`.")
            return await self.settings.credentials.bearer(presented)
        except CredentialRefused as refused:
            self.throttle.failed(client)
            raise Refusal(401, str(refused), {"WWW-Authenticate": "Bearer"}) from None

    async def _signed_head(self, scope: Scope, headers: Mapping[str, str], limits: Limits) -> None:
        """A signed request's checks that need no body, cheapest first, before it is read."""
        signers, method, path = self.settings.signers, scope["method"], scope["path"]
        try:
            timestamp = signers.check_head(method, path, headers)
        except CredentialRefused as refused:
            raise Refusal(401, str(refused), {"WWW-Authenticate": "Bearer"}) from None
        if "content-length" not in headers and "transfer-encoding" in headers:
            raise Refusal(411, UNDECLARED_LENGTH)
        limits.narrow(MAX_SIGNED_BODY, too_large_signed(MAX_SIGNED_BODY))
        _check_length(headers, limits)
        try:
            check_fresh(timestamp, await self.clock.now(scope["app"].state.connection.engine))
        except CredentialRefused as refused:
            raise Refusal(401, str(refused), {"WWW-Authenticate": "Bearer"}) from None

    async def _signed(self, scope: Scope, headers: Mapping[str, str], body: bytes) -> Principal:
        try:
            return await self.settings.signers.principal(
                scope["app"].state.connection.engine,  # the replay table's database
                scope["method"],
                scope["path"],
                scope.get("query_string", b"").decode("latin-1"),
                headers,
                body,
            )
        except CredentialRefused as refused:
            raise Refusal(401, str(refused), {"WWW-Authenticate": "Bearer"}) from None


def _check_length(headers: Mapping[str, str], limits: Limits) -> None:
    """413 when the Content-Length already says the body is past the size limit."""
    length = headers.get("content-length", "").strip()
    if DIGITS.fullmatch(length) and int(length) > limits.max_bytes:
        raise Refusal(413, limits.refusal)


def client_of(scope: Scope) -> str:
    """The address a request came from: Lambda's source IP, or the socket's peer."""
    event = scope.get("aws.event")
    if isinstance(event, Mapping):
        source = event.get("requestContext", {}).get("http", {}).get("sourceIp")
        if isinstance(source, str):
            return source
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _from_another_site(headers: Mapping[str, str]) -> bool:
    """Whether a browser sent this from a page of another origin (`Origin` names another
    host and port than the request's `Host`, or is "null"): curl and servers send none."""
    origin = headers.get("origin")
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc.lower() != headers.get("host", "").lower()


def _unauthenticated(settings: GuardSettings) -> str:
    ways = []
    if settings.credentials.configured:
        ways.append("Authorization: Bearer <a token or key>")
    if settings.signers:
        ways.append("X-Duly-Timestamp and X-Duly-Signature (HMAC-SHA256 of the request)")
    return f"Send a credential: {' or '.join(ways)}."


async def _read_or_refuse(
    scope: Scope, receive: Receive, send: Send, limits: Limits
) -> bytes | None:
    try:
        return await read_body(receive, limits)
    except BodyRefused as refused:
        await _refuse(scope, receive, send, refused.status, refused.detail)
        return None


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    headers: dict[str, str] | None = None,
) -> None:
    response = JSONResponse({"detail": detail}, status_code=status, headers=headers)
    await response(scope, receive, send)
