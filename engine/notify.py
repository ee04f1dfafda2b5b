"""The one NOTIFY channel: news that work is ready, sent in the writing transaction.

A payload names the workflow table that has work ready now, or is `*` for
news every worker must look at (the test clock moved). A transaction that
rolls back announces nothing, because NOTIFY is part of it.
"""

from __future__ import annotations

from sqlalchemy import Select, func, select

CHANNEL = "duly"
EVERYONE = "*"


def notify(payload: str) -> Select[tuple[object]]:
    """A statement that announces `payload` on the duly channel when its transaction commits."""
    return select(func.pg_notify(CHANNEL, payload))
