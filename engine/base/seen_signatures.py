"""The signatures already taken: each signed request's digest, kept until its window closes.

`duly_seen_signatures` holds the SHA-256 of every signature the HTTP guard
took, with the instant its timestamp stops being taken anyway. Declared
like `duly_clock`, on every base that maps a workflow, so `create_all` and
Alembic carry it; `record_signature` takes a signature once, and `duly
prune` deletes the rows past `expires_at`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    Index,
    LargeBinary,
    MetaData,
    Table,
    any_,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Select

from engine.base.clock import db_now
from engine.base.errors import ConfigurationError, InvalidArgumentError

SEEN_SIGNATURES_TABLE = "duly_seen_signatures"
DIGEST_BYTES = 32  # a SHA-256
PRUNED_PER_RECORD = 20  # expired rows each record deletes on its way: the table stays small
UNDEFINED_TABLE = "42P01"  # PostgreSQL's SQLSTATE for a table that does not exist


def declare_seen_signatures_table(metadata: MetaData) -> Table:
    """Add `duly_seen_signatures` to `metadata` (once) so schema tools create it."""
    existing = metadata.tables.get(SEEN_SIGNATURES_TABLE)
    if existing is not None:
        return existing
    return Table(
        SEEN_SIGNATURES_TABLE,
        metadata,
        Column("digest", LargeBinary, primary_key=True),
        Column("expires_at", DateTime(timezone=True), nullable=False),
        CheckConstraint(
            f"octet_length(digest) = {DIGEST_BYTES}", name="duly_seen_signatures_sha256"
        ),
        Index("ix_duly_seen_signatures_expires", "expires_at", "digest"),
    )


# The statements' own handle, whichever metadata the application's table is on.
seen_signatures = declare_seen_signatures_table(MetaData())


@dataclass(frozen=True)
class Recorded:
    """What recording a signature found: the database's time, and whether it was new."""

    now: datetime
    in_window: bool  # the signature's timestamp is within the window of now
    first: bool  # recorded now: no request carried this signature before
    pruned: int  # expired rows deleted on the way


@functools.cache  # built once: building a statement costs more than running this one
def record_statement() -> Select[Any]:
    """Record :digest, signed at :signed_at (Unix seconds), unless seen or out of :window.

    One statement: the database's time, a few expired rows deleted, the
    digest inserted when the timestamp is within the window of that time.
    """
    table = seen_signatures
    signed_at = bindparam("signed_at", type_=BigInteger)
    window = bindparam("window", type_=Float)
    now = select(db_now().label("at")).cte("now")
    at = select(now.c.at).scalar_subquery()
    in_window = func.abs(func.extract("epoch", at) - signed_at) <= window
    # The oldest expired rows no other record is deleting (SKIP LOCKED: nobody waits).
    expired_ids: Select[Any] = (
        select(literal_column("ctid"))
        .select_from(table)
        .where(table.c.expires_at < at)
        .order_by(table.c.expires_at)
        .limit(PRUNED_PER_RECORD)
        .with_for_update(skip_locked=True)
    )
    pruned = (
        delete(table)
        .where(literal_column("ctid") == any_(func.array(expired_ids.scalar_subquery())))
        .returning(table.c.digest)
        .cte("pruned")
    )
    # Kept until the timestamp leaves the window: after that the timestamp alone refuses it.
    expires = func.to_timestamp(signed_at) + func.make_interval(0, 0, 0, 0, 0, 0, window)
    recorded = (
        insert(table)
        .from_select(
            ["digest", "expires_at"],
            select(bindparam("digest", type_=LargeBinary), expires).where(in_window),
        )
        # A second request with the signature, even one at the same instant, inserts nothing.
        .on_conflict_do_nothing(index_elements=[table.c.digest])
        .returning(table.c.digest)
        .cte("recorded")
    )
    return select(
        at.label("now"),
        select(in_window).scalar_subquery().label("in_window"),
        exists(select(recorded.c.digest)).label("first"),
        select(func.count()).select_from(pruned).scalar_subquery().label("pruned"),
    )


async def record_signature(
    engine: AsyncEngine, digest: bytes, signed_at: int, window: float
) -> Recorded:
    """Take a signature once: record its digest, in a transaction of its own.

    `first` is False when a request carried it before; nothing is recorded
    when `signed_at` is more than `window` seconds from the database's time.
    """
    if len(digest) != DIGEST_BYTES:
        raise InvalidArgumentError(
            f"A signature's digest is {DIGEST_BYTES} bytes, not {len(digest)}."
        )
    params = {"digest": digest, "signed_at": signed_at, "window": window}
    try:
        async with engine.begin() as conn:
            row = (await conn.execute(record_statement(), params)).one()
    except ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) == UNDEFINED_TABLE:
            raise ConfigurationError(
                f"The database has no {SEEN_SIGNATURES_TABLE} table, where signed requests "
                "are recorded: run duly migrate."
            ) from exc
        raise
    return Recorded(
        now=row.now, in_window=bool(row.in_window), first=bool(row.first), pruned=row.pruned
    )
