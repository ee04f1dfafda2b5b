"""The tables duly owns beside an application's: declared together on its metadata.

Every base that maps a workflow, or declares its engine tables, carries them,
so `create_all` and Alembic create them with the application's own tables.
"""

from __future__ import annotations

from sqlalchemy import MetaData, Table

from engine.base.audit import AUDIT_TABLE, declare_audit_table
from engine.base.clock import CLOCK_TABLE, declare_clock_table
from engine.base.seen_signatures import SEEN_SIGNATURES_TABLE, declare_seen_signatures_table
from engine.base.sessions import SESSIONS_TABLE, declare_sessions_table

OWNED_TABLES = frozenset({AUDIT_TABLE, CLOCK_TABLE, SEEN_SIGNATURES_TABLE, SESSIONS_TABLE})


def declare_owned_tables(metadata: MetaData) -> Table:
    """Add duly's own tables to `metadata` (each once); the clock table, which callers keep.

    `duly_clock` (the database clock's shift), `duly_seen_signatures` (the HTTP
    guard's signed requests), `duly_console_sessions` (the console's logins) and
    `duly_audit` (who did what).
    """
    declare_seen_signatures_table(metadata)
    declare_sessions_table(metadata)
    declare_audit_table(metadata)
    return declare_clock_table(metadata)
