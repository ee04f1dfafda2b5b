"""The one NOTIFY channel: news that work is ready, sent in the writing transaction.

A payload names the workflow table that has work ready now, or is `*` for
news every worker must look at (the test clock moved). A transaction that
rolls back announces nothing, because NOTIFY is part of it.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, Text, func, select

from engine.literals import text_constant

CHANNEL = "duly"
EVERYONE = "*"


def announcement(payload: str) -> ColumnElement[str]:
    """pg_notify as a select-list value: it returns void, so it is cast to text (NULL)."""
    return func.pg_notify(text_constant(CHANNEL), text_constant(payload)).cast(Text)


def notify(payload: str) -> Select[tuple[str]]:
    """A statement that announces `payload` on the duly channel when its transaction commits."""
    return select(announcement(payload))
