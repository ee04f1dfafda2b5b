"""Who may write, and how much: the token, the webhook signature and the body limit.

Every write (any method but GET, HEAD and OPTIONS) needs `Authorization:
Bearer $DULY_API_TOKEN`, or an HMAC-SHA256 signature of the body under
`DULY_WEBHOOK_SECRET`: `X-Duly-Timestamp: <unix seconds>` and
`X-Duly-Signature: sha256=<hex of HMAC(secret, f"{timestamp}.{body}")>`,
refused 5 minutes either side of now. With neither variable set, writes are
open (local development). A body over `DULY_MAX_BODY_BYTES` (1 MiB) is 413.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from engine.base import settings as variables

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A header number is ASCII digits only: str.isdigit() takes "²", which int() refuses.
DIGITS = re.compile(r"[0-9]+")
DEFAULT_MAX_BODY_BYTES = variables.MAX_BODY_BYTES.default
FOREIGN_WRITE = (
    "Writes are open here (no DULY_API_TOKEN or DULY_WEBHOOK_SECRET), so a page of another "
    "site may not send them: this request's Origin is not this server."
)
SIGNATURE_WINDOW = 300  # seconds either side of now a signed request is taken
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class ConsoleGate(Protocol):
    """What the guard asks the console (`ConsoleAuth`) of a write to one of its pages."""

    def owns(self, path: str) -> bool:
        """Whether `path` is one of the console's."""
        ...

    async def refused_write(
        self, scope: Scope, headers: Mapping[str, str], body: bytes
    ) -> ASGIApp | None:
        """The page that refuses this write, or None when it may go on."""
        ...


@dataclass(frozen=True)
class GuardSettings:
    """Who may write, and the largest body any request may send."""

    token: str | None = None
    secret: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GuardSettings:
        """DULY_API_TOKEN, DULY_WEBHOOK_SECRET and DULY_MAX_BODY_BYTES; empty means unset."""
        return cls(
            token=variables.API_TOKEN.read(environ),
            secret=variables.WEBHOOK_SECRET.read(environ),
            max_body_bytes=variables.MAX_BODY_BYTES.read(environ),
        )

    @property
    def open(self) -> bool:
        """Whether writes need nothing (neither a token nor a secret is set: local dev)."""
        return self.token is None and self.secret is None


def signature_of(secret: str, timestamp: str, body: bytes) -> str:
    """The X-Duly-Signature value of `body` sent at `timestamp`: `sha256=<hex>`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


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
        if not bearer and self.settings.secret is None and self.settings.token is not None:
            await _refuse(scope, receive, send, 401, _unauthenticated(self.settings))
            return
        try:
            body = await _read_body(receive, limit)
        except BodyTooLarge:
            await _refuse(scope, receive, send, 413, _too_large(limit))
            return
        if not bearer and not self.settings.open:
            refused = self._signature_refused(headers, body)
            if refused is not None:
                await _refuse(scope, receive, send, 401, refused)
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
        refusal = await self.console.refused_write(scope, headers, body)
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

    def _signature_refused(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Why the request's signature is not good, or None when it is."""
        secret = self.settings.secret
        if secret is None:
            return _unauthenticated(self.settings)
        timestamp = headers.get("x-duly-timestamp", "").strip()
        signature = headers.get("x-duly-signature", "").strip()
        if not timestamp or not signature:
            return _unauthenticated(self.settings)
        if not DIGITS.fullmatch(timestamp) or len(timestamp) > 12:
            return "X-Duly-Timestamp must be the time of signing in whole Unix seconds."
        if abs(time.time() - int(timestamp)) > SIGNATURE_WINDOW:
            return (
                f"The signature's timestamp is more than {SIGNATURE_WINDOW // 60} minutes "
                "from now: sign the request again."
            )
        expected = signature_of(secret, timestamp, body)
        if not hmac.compare_digest(signature.encode(), expected.encode()):
            return "X-Duly-Signature does not match the body and timestamp."
        return None


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
    if settings.secret is not None:
        ways.append("X-Duly-Timestamp and X-Duly-Signature (HMAC-SHA256 of the body)")
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
