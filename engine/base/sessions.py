"""The console's login sessions: `duly_console_sessions`, a table duly owns like `duly_clock`.

A row is one login: the SHA-256 of the browser's cookie secret (never the
secret), who logged in, and when it started, expires and ended, all by the
database clock. It is declared on the metadata of every base that maps a
workflow or declares its engine tables, so `create_all` and Alembic carry
it; `duly prune` deletes rows a day past their end (`engine.retention`).
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    DateTime,
    Index,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY

SESSIONS_TABLE = "duly_console_sessions"


def declare_sessions_table(metadata: MetaData) -> Table:
    """Add `duly_console_sessions` to `metadata` (once) so schema tools create it."""
    existing = metadata.tables.get(SESSIONS_TABLE)
    if existing is not None:
        return existing
    return Table(
        SESSIONS_TABLE,
        metadata,
        Column("id", Text, primary_key=True),  # hex SHA-256 of the cookie's secret
        Column("principal_id", Text, nullable=False),
        Column("name", Text),  # a person's display name, when the credential said one
        Column("roles", ARRAY(Text), nullable=False, server_default=text("'{}'")),
        Column("groups", ARRAY(Text), nullable=False, server_default=text("'{}'")),
        Column("via", Text, nullable=False),  # how the login was made: oidc, api-key, token
        # What the login typed, as a digest: the session ends when it is no longer configured.
        Column("credential", Text),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("expires_at", DateTime(timezone=True), nullable=False),
        Column("ended_at", DateTime(timezone=True)),  # logged out; NULL while it lasts
        CheckConstraint("id ~ '^[0-9a-f]{64}$'", name="duly_console_sessions_id_digest"),
        CheckConstraint("expires_at > created_at", name="duly_console_sessions_expiry"),
        # What `duly prune` walks: sessions by when they expire.
        Index("ix_duly_console_sessions_expires", "expires_at", "id"),
    )


# The table as duly's own queries use it, independent of whichever metadata creates it.
console_sessions = declare_sessions_table(MetaData())
