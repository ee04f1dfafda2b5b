"""The console's login sessions, kept in `duly_console_sessions`: started, found, ended.

The browser holds a random secret (the session cookie); the row's id is its
SHA-256, so the table never holds what would open a session. A session is
good while it has not ended and has not expired, by the database clock; an
issuer's login expires with its ID token. Each function owns its short
transaction.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import console_sessions, db_now
from functions.identity.principal import Principal, Role, Via

SESSION_SECONDS = 12 * 60 * 60  # a session's life
MAX_SECRET = 100  # characters of a cookie secret worth looking up
ROLE_WORDS = frozenset(role.value for role in Role)
WAYS = frozenset(way.value for way in Via)

_c = console_sessions.c


def session_id(secret: str) -> str:
    """The row id of a cookie secret: its hex SHA-256."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    """A good session: the cookie's secret and who it is."""

    secret: str
    principal: Principal
    credential: str | None = None  # the digest of the key or token typed; None for an issuer
    way: Via | None = None  # how the login was made (Via.OIDC: at the issuer)


class SessionTooLate(Exception):
    """A session that would end before it starts: its ID token has expired."""


async def start_session(
    engine: AsyncEngine,
    principal: Principal,
    credential: str | None = None,
    until: datetime | None = None,
) -> Session:
    """A new session of `principal`, good for SESSION_SECONDS or `until` (its token's exp),
    whichever is first; its cookie secret. `credential` is the digest of what was typed
    (`ConsoleAuth.credential_of`). SessionTooLate when `until` has passed."""
    secret = secrets.token_urlsafe(32)
    async with engine.begin() as conn:
        now = (await conn.execute(select(db_now()))).scalar_one()
        assert isinstance(now, datetime)
        expires = now + timedelta(seconds=SESSION_SECONDS)
        if until is not None:
            if until <= now:
                raise SessionTooLate
            expires = min(expires, until)
        await conn.execute(
            insert(console_sessions).values(
                id=session_id(secret),
                principal_id=principal.id,
                name=principal.name,
                roles=sorted(principal.roles),
                groups=sorted(principal.groups),
                via=principal.via.value,
                credential=credential,
                created_at=now,
                expires_at=expires,
            )
        )
    return Session(secret, session_principal(principal), credential, principal.via)


async def find_session(engine: AsyncEngine, secret: str | None) -> Session | None:
    """The good session of a cookie's secret; None for an unknown, ended or expired one."""
    if not secret or len(secret) > MAX_SECRET:
        return None
    query = select(_c.principal_id, _c.name, _c.roles, _c.groups, _c.via, _c.credential).where(
        _c.id == session_id(secret), _c.ended_at.is_(None), _c.expires_at > db_now()
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        return None
    principal = Principal(
        id=row.principal_id,
        roles=frozenset(Role(word) for word in row.roles if word in ROLE_WORDS),
        via=Via.SESSION,
        groups=frozenset(row.groups),
        name=row.name,
    )
    way = Via(row.via) if row.via in WAYS else None
    return Session(secret, principal, row.credential, way)


async def end_session(engine: AsyncEngine, secret: str) -> bool:
    """End the session of `secret` (logout): its cookie opens nothing after; whether it was
    a good one."""
    ended = (
        update(console_sessions)
        .where(_c.id == session_id(secret), _c.ended_at.is_(None))
        .values(ended_at=db_now())
    )
    async with engine.begin() as conn:
        return (await conn.execute(ended)).rowcount > 0


def session_principal(principal: Principal) -> Principal:
    """The principal a session acts as: the one who logged in, through the session."""
    return replace(principal, via=Via.SESSION, routes=None)
