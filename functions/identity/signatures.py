"""Signed requests: HMAC-SHA256 over the whole request, under a secret held to routes, once.

A sender signs `f"{timestamp}\\n{METHOD}\\n{path}\\n{query}\\n"` followed by the
body (`signature_of`), under `DULY_WEBHOOK_SECRET` (any route) or one of the
named `DULY_WEBHOOK_SECRETS` (held to its routes). `Signers.principal` takes a
signature within 5 minutes of its timestamp, and only once
(`engine.base.seen_signatures`); the principal is an operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import ConfigurationError, db_now, key_refusal, record_signature, settings as variables
from functions.identity.principal import SIGNED_PREFIX, Principal, Role, Via
from functions.identity.roles import MAX_NAME, CredentialRefused

# A header number is ASCII digits only: str.isdigit() takes "²", which int() refuses.
DIGITS = re.compile(r"[0-9]+")
MAX_TIMESTAMP_DIGITS = 12  # Unix seconds for the next 30,000 years
SIGNATURE_WINDOW = 300  # seconds either side of now a signed request is taken
TIMESTAMP_HEADER = "x-duly-timestamp"
SIGNATURE_HEADER = "x-duly-signature"
PREFIX = "sha256="
SIGNATURE = re.compile(r"sha256=[0-9a-f]{64}")
STALE = (
    f"The signature's timestamp is more than {SIGNATURE_WINDOW // 60} minutes from now: sign the "
    "request again."
)
# A signed body is read before anyone is known: smaller than other bodies, its length declared.
MAX_SIGNED_BODY = 256 * 1024
CLOCK_TTL = 5.0  # seconds the database clock's offset is trusted before it is read again
WEBHOOK = "webhook"  # the name DULY_WEBHOOK_SECRET signs as
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")
# "METHOD /path", `*` standing for any text; no `?` or `[`, which fnmatch would read as patterns.
ROUTE = re.compile(r"[A-Za-z]+ /[^\s?\[\]]*")
ENTRY_KEYS = frozenset({"name", "secret", "routes"})


def signature_of(
    secret: str, timestamp: str, method: str, path: str, query: str, body: bytes
) -> str:
    """The X-Duly-Signature of a request: `sha256=<hex>` of its time, method, path, query, body.

    `path` is the path the server routes (percent-decoded), `query` the raw query string
    without its `?` ("" when none).
    """
    signed = f"{timestamp}\n{method.upper()}\n{path}\n{query}\n".encode() + body
    return PREFIX + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SigningSecret:
    """One secret: the name its requests act as, and the routes it may sign (None: any)."""

    name: str
    secret: str = field(repr=False)
    routes: frozenset[str] | None = None

    def principal(self) -> Principal:
        """Who a request signed with this secret acts as: an operator, held to its routes."""
        return Principal(
            id=f"{SIGNED_PREFIX}{self.name}",
            roles=frozenset({Role.OPERATOR}),
            via=Via.SIGNATURE,
            routes=self.routes,
        )


@dataclass(frozen=True)
class Signers:
    """The configured signing secrets; `principal` names who signed a request."""

    secrets: tuple[SigningSecret, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.secrets)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Signers:
        """DULY_WEBHOOK_SECRET (any route) and DULY_WEBHOOK_SECRETS (each held to its routes)."""
        found: list[SigningSecret] = []
        shared = variables.WEBHOOK_SECRET.read(environ)
        if shared is not None:
            found.append(SigningSecret(WEBHOOK, shared))
        raw = variables.WEBHOOK_SECRETS.read(environ)
        if raw:
            found.extend(parse_secrets(raw))
        _check_distinct(found)
        return cls(tuple(found))

    async def principal(
        self,
        engine: AsyncEngine,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
    ) -> Principal:
        """Who signed this request (headers by lowercase name); CredentialRefused saying why.

        Refused: no signature, a timestamp that is not whole Unix seconds, no secret
        matching, a timestamp more than 5 minutes from the database's time, or a
        signature a request carried before (recorded on `engine`, in its own transaction).
        """
        timestamp, signature = signed_headers(headers)
        signer = self._signer(timestamp, method, path, query, body, signature)
        if signer is None:
            raise CredentialRefused(
                "X-Duly-Signature does not match this request (its timestamp, method, path, "
                "query and body) under any signing secret."
            )
        digest = hashlib.sha256(signature.encode()).digest()
        recorded = await record_signature(engine, digest, int(timestamp), SIGNATURE_WINDOW)
        if not recorded.in_window:
            raise CredentialRefused(STALE)
        if not recorded.first:
            raise CredentialRefused(
                "This signature was taken before: a signed request is taken once, so sign "
                "each request anew."
            )
        return signer.principal()

    def check_head(self, method: str, path: str, headers: Mapping[str, str]) -> int:
        """The signed timestamp, once what needs no body holds: CredentialRefused saying why.

        The two headers' shapes, and a secret that may sign `METHOD path`; the
        timestamp's window is `check_fresh`'s (it needs the database's time).
        """
        timestamp, _ = signed_headers(headers)
        if not any(signer.principal().route_allowed(method, path) for signer in self.secrets):
            raise CredentialRefused(f"No signing secret may sign {method.upper()} {path}.")
        return int(timestamp)

    def _signer(
        self, timestamp: str, method: str, path: str, query: str, body: bytes, signature: str
    ) -> SigningSecret | None:
        """The secret the signature is made with; every secret compared, in constant time."""
        found = None
        given = signature.encode()
        for candidate in self.secrets:
            expected = signature_of(candidate.secret, timestamp, method, path, query, body)
            if hmac.compare_digest(given, expected.encode()):
                found = candidate
        return found


def signed_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    """The timestamp and signature headers, each of its shape; CredentialRefused if not."""
    timestamp = headers.get(TIMESTAMP_HEADER, "").strip()
    signature = headers.get(SIGNATURE_HEADER, "").strip()
    if not timestamp or not signature:
        raise CredentialRefused(
            "Sign the request: X-Duly-Timestamp and X-Duly-Signature (HMAC-SHA256 of the "
            "timestamp, method, path, query and body)."
        )
    if not DIGITS.fullmatch(timestamp) or len(timestamp) > MAX_TIMESTAMP_DIGITS:
        raise CredentialRefused(
            "X-Duly-Timestamp must be the time of signing in whole Unix seconds."
        )
    if not SIGNATURE.fullmatch(signature):
        raise CredentialRefused(
            "X-Duly-Signature must be sha256= and the HMAC-SHA256's 64 lowercase hex digits."
        )
    return timestamp, signature


def check_fresh(timestamp: int, now: float) -> None:
    """CredentialRefused when `timestamp` is out of the window around `now` (Unix seconds)."""
    if abs(timestamp - now) > SIGNATURE_WINDOW:
        raise CredentialRefused(STALE)


class DatabaseClock:
    """The database's time (its clock shift included) as this process reckons it: the
    offset from this machine's clock, read again at most every CLOCK_TTL seconds."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.read_at: float | None = None
        self.lock = asyncio.Lock()

    async def now(self, engine: AsyncEngine) -> float:
        """The database's time in Unix seconds, reading its clock if the offset is old."""
        async with self.lock:  # one read at a time: a burst of requests waits for it
            if self.read_at is None or time.monotonic() - self.read_at > CLOCK_TTL:
                async with engine.connect() as conn:
                    database = cast(datetime, (await conn.execute(select(db_now()))).scalar_one())
                self.offset = database.timestamp() - time.time()
                self.read_at = time.monotonic()
        return time.time() + self.offset


def parse_secrets(raw: str) -> list[SigningSecret]:
    """DULY_WEBHOOK_SECRETS' JSON list; ConfigurationError naming the entry, never a secret."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigurationError(
            "DULY_WEBHOOK_SECRETS must be a JSON list of {name, secret, routes}."
        ) from None
    if not isinstance(document, list):
        raise ConfigurationError(
            "DULY_WEBHOOK_SECRETS must be a JSON list of {name, secret, routes}."
        )
    return [_secret_of(entry, index) for index, entry in enumerate(document)]


def _secret_of(entry: object, index: int) -> SigningSecret:
    where = f"DULY_WEBHOOK_SECRETS[{index}]"
    if not isinstance(entry, dict) or set(entry) != ENTRY_KEYS:
        raise ConfigurationError(f"{where} must be an object of name, secret and routes.")
    name, secret, routes = entry["name"], entry["secret"], entry["routes"]
    if not isinstance(name, str) or len(name) > MAX_NAME or not NAME.fullmatch(name):
        raise ConfigurationError(f"{where}.name must be letters, digits and ._@+- only.")
    where = f"{where} ({name})"
    refused = key_refusal(f"{where}.secret", secret if isinstance(secret, str) else "")
    if refused is not None:
        raise ConfigurationError(refused)
    if not isinstance(routes, list) or not routes:
        raise ConfigurationError(
            f'{where}.routes must list the routes it may sign, such as ["POST /events"].'
        )
    return SigningSecret(name, secret, frozenset(_route(route, where) for route in routes))


def _route(route: object, where: str) -> str:
    """A route pattern as `Principal.route_allowed` matches it: `METHOD /path`, upper case."""
    if not isinstance(route, str) or not ROUTE.fullmatch(route):
        shown = repr(route)[:80]
        raise ConfigurationError(
            f'{where}.routes: {shown} is not "METHOD /path" (such as "POST /workflows/*/deliver"'
            "; * stands for any text)."
        )
    method, _, path = route.partition(" ")
    return f"{method.upper()} {path}"


def _check_distinct(found: list[SigningSecret]) -> None:
    """Names once each, and no secret twice (a signature must name one signer)."""
    names = [signer.name for signer in found]
    for name in names:
        if names.count(name) > 1:
            raise ConfigurationError(
                f"Two signing secrets are named {name!r} (DULY_WEBHOOK_SECRET signs as "
                f"{WEBHOOK!r}): name each once."
            )
    for index, signer in enumerate(found):
        for other in found[index + 1 :]:
            if hmac.compare_digest(signer.secret.encode(), other.secret.encode()):
                raise ConfigurationError(
                    f"The signing secrets {signer.name!r} and {other.name!r} are the same: "
                    "give each its own."
                )
