"""The one NOTIFY channel: news that work is ready.

A payload names the workflow table that has work ready now, or is `*` for news every
worker must look at (the test clock moved). Most writers send it in their own
transaction, so a rollback announces nothing; a writer that sends it after its COMMIT
announces only what was committed.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, Text, func, select

from engine.base.literals import text_constant

CHANNEL = "duly"
EVERYONE = "*"


def announcement(payload: str) -> ColumnElement[str]:
    """pg_notify as a select-list value: it returns void, so it is cast to text (NULL)."""
    return func.pg_notify(text_constant(CHANNEL), text_constant(payload)).cast(Text)


def notify(payload: str) -> Select[tuple[str]]:
    """A statement that announces `payload` on the duly channel when its transaction commits."""
    return select(announcement(payload))
