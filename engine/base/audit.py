"""The operators' audit trail: `duly_audit`, one row per action a person took, never updated.

Who acted (the principal's id and the door they came through), what they did,
to which workflow and which runs (a key, a filter), how many rows it touched,
all at the database clock's time. `record_action` writes it in the caller's
transaction, so the record exists exactly when the action committed. Declared
on every base that maps a workflow, like `duly_clock`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from engine.base.clock import db_now
from engine.base.errors import InvalidArgumentError
from engine.base.shown import bounded_value, json_value

AUDIT_TABLE = "duly_audit"
MAX_ACTIONS_READ = 500  # records one read returns at most
MAX_NAME = 200  # characters of an actor, a door or an action's name
MAX_STORED = 16_384  # characters of a subject's or a detail's JSON; longer ones are cut


def declare_audit_table(metadata: MetaData) -> Table:
    """Add `duly_audit` to `metadata` (once) so schema tools create it."""
    existing = metadata.tables.get(AUDIT_TABLE)
    if existing is not None:
        return existing
    return Table(
        AUDIT_TABLE,
        metadata,
        Column("id", BigInteger, Identity(), primary_key=True),
        Column("at", DateTime(timezone=True), nullable=False),
        Column("actor", Text, nullable=False),  # the principal's id
        Column("via", Text, nullable=False),  # the door: http, console, cli, lambda
        Column("action", Text, nullable=False),  # e.g. run.cancel, bulk.run, schedule.pause
        Column("workflow", Text),
        Column("subject", JSONB),  # which runs: a key, keys, a filter
        Column("count", Integer),  # rows the action touched, when it is counted
        Column("detail", JSONB),  # the action's own particulars (a step, a batch)
        # Reads go newest first, for everyone or for one workflow.
        Index("ix_duly_audit_at", "at", "id"),
        Index("ix_duly_audit_workflow", "workflow", "id"),
    )


# The table as duly's own statements use it, whichever metadata creates it.
audit = declare_audit_table(MetaData())


@dataclass(frozen=True)
class AuditEntry:
    """One recorded action."""

    id: int
    at: datetime
    actor: str
    via: str
    action: str
    workflow: str | None
    subject: Any
    count: int | None
    detail: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """The entry as the API answers it."""
        return {
            "id": self.id,
            "at": self.at.isoformat(),
            "actor": self.actor,
            "via": self.via,
            "action": self.action,
            "workflow": self.workflow,
            "subject": self.subject,
            "count": self.count,
            "detail": self.detail,
        }


async def record_action(
    session: AsyncSession,
    *,
    actor: str,
    via: str,
    action: str,
    workflow: str | None,
    subject: Any,
    count: int | None = None,
    detail: Mapping[str, Any] | None = None,
) -> int:
    """Record that `actor` did `action`, in the session's transaction (it commits with it);
    the record's id."""
    for name, value in (("actor", actor), ("via", via), ("action", action)):
        if not value or len(value) > MAX_NAME:
            raise InvalidArgumentError(f"An audit record's {name} is 1 to {MAX_NAME} characters.")
    values = {
        "at": db_now(),
        "actor": actor,
        "via": via,
        "action": action,
        "workflow": workflow,
        "subject": _stored(subject),
        "count": count,
        "detail": None if detail is None else _stored(dict(detail)),
    }
    return int(
        (await session.execute(insert(audit).values(values).returning(audit.c.id))).scalar_one()
    )


def _stored(value: Any) -> Any:
    """A value as JSONB stores it: JSON's types, nested and long values bounded.

    JSON longer than MAX_STORED characters is kept as its beginning, under `cut`.
    """
    stored = json_value(bounded_value(value))
    text = json.dumps(stored)
    return stored if len(text) <= MAX_STORED else {"cut": text[:MAX_STORED]}


async def recent_actions(
    session: AsyncSession,
    *,
    workflow: str | None = None,
    before: int | None = None,
    limit: int = 50,
) -> list[AuditEntry]:
    """The newest actions first (of one workflow, before the record `before`), at most `limit`."""
    if not 1 <= limit <= MAX_ACTIONS_READ:
        raise InvalidArgumentError(f"Read 1 to {MAX_ACTIONS_READ} audit records, not {limit}.")
    statement = select(audit).order_by(audit.c.id.desc()).limit(limit)
    if workflow is not None:
        statement = statement.where(audit.c.workflow == workflow)
    if before is not None:
        statement = statement.where(audit.c.id < before)
    rows = (await session.execute(statement)).mappings().all()
    return [AuditEntry(**row) for row in rows]
