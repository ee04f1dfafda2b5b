"""The audit trail: one row per action, written with the change it records, never updated.

The action types and metadata keys readers may rely on are listed in
docs/architecture.md ("Graph workflows"). Rows are ordered by created_at,
then id: a transaction's rows share its time, and ids follow the order the
runtime wrote them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, Uuid, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.graphs.design.model import Node
from engine.graphs.moves.actors import on_behalf
from engine.graphs.tables import GraphTables


@dataclass(frozen=True)
class HistoryEntry:
    """One recorded action of an instance."""

    id: int
    instance_id: uuid.UUID
    visit_id: uuid.UUID | None
    action_type: str
    actor: str | None
    step_name: str
    message: str
    metadata: dict[str, Any]
    created_at: datetime
    acted_by: str | None = None  # who acted in the actor's stead (an admin), if anyone

    @property
    def done_by(self) -> str | None:
        """Who the trail says acted: "mia", "api-token on behalf of mia", None for the engine."""
        return None if self.actor is None else on_behalf(self.actor, self.acted_by)

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON values."""
        return {
            "id": self.id,
            "instance_id": str(self.instance_id),
            "visit_id": None if self.visit_id is None else str(self.visit_id),
            "action_type": self.action_type,
            "actor": self.actor,
            "acted_by": self.acted_by,
            "done_by": self.done_by,
            "step_name": self.step_name,
            "message": self.message,
            "metadata": dict(self.metadata),
            "created_at": self.created_at.isoformat(),
        }

    json = to_dict


@dataclass(frozen=True)
class HistoryRow:
    """A history row to write (the transaction gives it its time and id)."""

    action_type: str
    message: str
    step_name: str = ""
    actor: str | None = None
    visit_id: uuid.UUID | None = None
    details: dict[str, Any] = field(default_factory=dict)
    acted_by: str | None = None


def state_name(node: Node) -> str:
    """How from_state and to_state name a node: its state code, else its name."""
    return node.state_code or node.title


def details(**values: Any) -> dict[str, Any]:
    """Metadata, None left out. Ids in it (however deep) become text as the write's JSON
    document is made (`engine.graphs.moves.write_document.parameters`), not one by one here."""
    return {key: value for key, value in values.items() if value is not None}


@lru_cache(maxsize=64)
def history_statement(tables: GraphTables) -> Select[Any]:
    """Every history row of :instance_id, in the order the actions happened."""
    history = tables.table("history")
    return (
        select(history)
        .where(history.c.instance_id == bindparam("instance_id", type_=Uuid()))
        .order_by(history.c.created_at, history.c.id)
    )


async def read_history(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID
) -> list[HistoryEntry]:
    """The instance's history, oldest first."""
    result = await conn.execute(history_statement(tables), {"instance_id": instance_id})
    return [
        HistoryEntry(
            id=row["id"],
            instance_id=row["instance_id"],
            visit_id=row["visit_id"],
            action_type=row["action_type"],
            actor=row["actor"],
            step_name=row["step_name"],
            message=row["message"],
            metadata=dict(row["metadata"] or {}),
            created_at=row["created_at"],
            acted_by=row["acted_by"],
        )
        for row in result.mappings()
    ]
