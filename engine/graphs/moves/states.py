"""The state a move holds of an instance and its branches, as it will leave them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine.graphs.tables import ACTIVE


@dataclass
class InstanceState:
    """An instance's row as this transaction will leave it."""

    id: uuid.UUID
    template_id: uuid.UUID
    subject_type: str
    subject_key: str
    state_status: str
    status: str
    current_node_id: uuid.UUID | None
    state_code: str | None
    is_active: bool
    is_completed: bool
    branch_count: int
    submitted_by: str | None
    submitted_at: datetime | None = None  # None: submitted by this transaction
    completed_at: datetime | None = None
    new: bool = False  # inserted by this transaction
    completing: bool = False  # completed_at is this transaction's time

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> InstanceState:
        """From a row of the instances table."""
        return cls(
            id=row["id"],
            template_id=row["template_id"],
            subject_type=row["subject_type"],
            subject_key=row["subject_key"],
            state_status=row["state_status"],
            status=row["status"],
            current_node_id=row["current_node_id"],
            state_code=row["state_code"],
            is_active=row["is_active"],
            is_completed=row["is_completed"],
            branch_count=row["branch_count"],
            submitted_by=row["submitted_by"],
            submitted_at=row["submitted_at"],
            completed_at=row["completed_at"],
        )

    def mapping(self) -> dict[str, Any]:
        """The instance as a condition predicate sees it."""
        return {
            "id": self.id,
            "template_id": self.template_id,
            "subject_type": self.subject_type,
            "subject_key": self.subject_key,
            "state_status": self.state_status,
            "status": self.status,
            "current_node_id": self.current_node_id,
            "state_code": self.state_code,
            "submitted_by": self.submitted_by,
            "submitted_at": self.submitted_at,
        }


@dataclass
class BranchState:
    """A branch as this transaction will leave it, with its current visit."""

    id: uuid.UUID
    number: int
    node_id: uuid.UUID | None
    status: str
    parent_branch_id: uuid.UUID | None = None
    fork_scope: uuid.UUID | None = None
    fork_node_id: uuid.UUID | None = None
    join_node_id: uuid.UUID | None = None
    started_at: datetime | None = None  # None: started by this transaction
    completed_at: datetime | None = None
    visit_id: uuid.UUID | None = None  # the current visit, if it sits on a node that has one
    last_code: str | None = None  # the last business state it was on (END reports it)
    new: bool = False  # inserted by this transaction
    changed: bool = False  # updated by this transaction
    completing: bool = False  # completed_at is this transaction's time
    assignees: list[str] = field(default_factory=list)  # of the state it entered here

    @classmethod
    def of(cls, row: Mapping[str, Any], prefix: str = "") -> BranchState:
        """From a row of the branches table (and `visit_id`, when read with its visit), its
        columns named with `prefix` (the lock statement's `live_`)."""
        return cls(
            id=row[prefix + "id"],
            number=row[prefix + "number"],
            node_id=row[prefix + "current_node_id"],
            status=row[prefix + "status"],
            parent_branch_id=row[prefix + "parent_branch_id"],
            fork_scope=row[prefix + "fork_scope"],
            fork_node_id=row[prefix + "fork_node_id"],
            join_node_id=row[prefix + "join_node_id"],
            started_at=row[prefix + "started_at"],
            completed_at=row[prefix + "completed_at"],
            visit_id=row.get(prefix + "visit_id"),
        )

    @property
    def active(self) -> bool:
        """Whether the branch is still a live token."""
        return self.status == ACTIVE

    def order(self) -> tuple[int, datetime | None, int]:
        """The "oldest" order: started_at, then number; this transaction's come last."""
        if self.started_at is None:
            return (1, None, self.number)
        return (0, self.started_at, self.number)


# The columns a BranchState is read from.
BRANCH_COLUMNS = (
    "id",
    "number",
    "current_node_id",
    "status",
    "parent_branch_id",
    "fork_scope",
    "fork_node_id",
    "join_node_id",
    "started_at",
    "completed_at",
)
