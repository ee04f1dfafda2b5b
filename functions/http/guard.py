"""Who may write, and how much: the token, the webhook signature and the body limit.

Every write (any method but GET, HEAD and OPTIONS) needs `Authorization:
Bearer $DULY_API_TOKEN`, or a signature of the request under a signing secret
(`functions.identity.signatures`: `X-Duly-Timestamp` and `X-Duly-Signature`,
taken once, within 5 minutes). With no token and no secret set, writes are
open (local development). A body over `DULY_MAX_BODY_BYTES` (1 MiB) is 413.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from engine.base import settings as variables
from functions.identity.access import PRINCIPAL_SCOPE
from functions.identity.roles import CredentialRefused
from functions.identity.signatures import DIGITS, SIGNATURE_HEADER, Signers

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = variables.MAX_BODY_BYTES.default
FOREIGN_WRITE = (
    "Writes are open here (no DULY_API_TOKEN or DULY_WEBHOOK_SECRET), so a page of another "
    "site may not send them: this request's Origin is not this server."
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class ConsoleGate(Protocol):
    """What the guard asks the console (`ConsoleAuth`) of a write to one of its pages."""

    def owns(self, path: str) -> bool:
        """Whether `path` is one of the console's."""
        ...

    def refused_write(
        self, scope: Scope, headers: Mapping[str, str], body: bytes
    ) -> ASGIApp | None:
        """The page that refuses this write, or None when it may go on."""
        ...


@dataclass(frozen=True)
class GuardSettings:
    """Who may write, and the largest body any request may send.

    `signers` are the signing secrets; `secret` is one of them (DULY_WEBHOOK_SECRET
    first), what the console's keys derive from when no token is set.
    """

    token: str | None = None
    secret: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    signers: Signers = field(default_factory=Signers)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GuardSettings:
        """DULY_API_TOKEN, the signing secrets and DULY_MAX_BODY_BYTES; empty means unset."""
        signers = Signers.from_env(environ)
        return cls(
            token=variables.API_TOKEN.read(environ),
            # What the console's keys derive from without a token: any signing secret.
            secret=signers.secrets[0].secret if signers else None,
            max_body_bytes=variables.MAX_BODY_BYTES.read(environ),
            signers=signers,
        )

    @property
    def open(self) -> bool:
        """Whether writes need nothing (neither a token nor a secret is set: local dev)."""
        return self.token is None and self.secret is None and not self.signers


class BodyTooLarge(Exception):
    """A request body went past the limit while it was read."""


class WriteGuard:
    """Refuses bodies over the limit (413) and writes without a token or signature (401).

    Pure ASGI, so a body is counted as it arrives and never read past the
    limit; a write's body is read here (at most the limit) and handed on
    whole to the app, since its signature covers all of it. A write to the
    console (a browser's form) is judged by the console's rules instead
    (`ConsoleGate`): its CSRF token always, and the session the login form
    set whenever a token or secret is set.
    """

    def __init__(
        self, app: ASGIApp, settings: GuardSettings, console: ConsoleGate | None = None
    ) -> None:
        self.app = app
        self.settings = settings
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.settings.max_body_bytes
        length = headers.get("content-length", "")
        if DIGITS.fullmatch(length.strip()) and int(length) > limit:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return
        if scope["method"] in SAFE_METHODS:
            await self.app(scope, _counted(receive, limit), send)
            return
        if self.settings.open and _from_another_site(headers):
            await _refuse(scope, receive, send, 403, FOREIGN_WRITE)
            return
        if self.console is not None and self.console.owns(scope["path"]):
            await self._console_write(scope, receive, send, headers)
            return
        bearer = self._bearer_ok(headers)
        if not bearer and not self.settings.signers and self.settings.token is not None:
            await _refuse(scope, receive, send, 401, _unauthenticated(self.settings))
            return
        try:
            body = await _read_body(receive, limit)
        except BodyTooLarge:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return
        if not bearer and not self.settings.open:
            if not self.settings.signers or SIGNATURE_HEADER not in headers:
                await _refuse(scope, receive, send, 401, _unauthenticated(self.settings))
                return
            try:
                scope[PRINCIPAL_SCOPE] = await self.settings.signers.principal(
                    scope["app"].state.connection.engine,  # the replay table's database
                    scope["method"],
                    scope["path"],
                    scope["query_string"].decode("latin-1"),
                    headers,
                    body,
                )
            except CredentialRefused as refused:
                await _refuse(scope, receive, send, 401, str(refused))
                return
        await self.app(scope, _replayed(body, receive), send)

    async def _console_write(
        self, scope: Scope, receive: Receive, send: Send, headers: Mapping[str, str]
    ) -> None:
        assert self.console is not None
        limit = self.settings.max_body_bytes
        try:
            body = await _read_body(receive, limit)
        except BodyTooLarge:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return
        refusal = self.console.refused_write(scope, headers, body)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, _replayed(body, receive), send)

    def _bearer_ok(self, headers: Mapping[str, str]) -> bool:
        token = self.settings.token
        if token is None:
            return False
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        )


def _from_another_site(headers: Mapping[str, str]) -> bool:
    """Whether a browser sent this from a page of another origin (`Origin` names another
    host and port than the request's `Host`, or is "null"): curl and servers send none."""
    origin = headers.get("origin")
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc.lower() != headers.get("host", "").lower()


def _unauthenticated(settings: GuardSettings) -> str:
    ways = []
    if settings.token is not None:
        ways.append("Authorization: Bearer <DULY_API_TOKEN>")
    if settings.signers:
        ways.append("X-Duly-Timestamp and X-Duly-Signature (HMAC-SHA256 of the request)")
    return f"This route writes: send {' or '.join(ways)}."


def _too_large(limit: int) -> str:
    return f"The request body is larger than {limit} bytes (DULY_MAX_BODY_BYTES)."


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    response = JSONResponse({"detail": detail}, status_code=status, headers=headers)
    await response(scope, receive, send)


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as it passes `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: what came is all there is
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app `body` whole, then the client's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _counted(receive: Receive, limit: int) -> Receive:
    """A receive that fails with a 413 once the body passes `limit` (a GET with a body)."""
    size = 0

    async def counted() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise HTTPException(413, _too_large(limit))
        return message

    return counted
