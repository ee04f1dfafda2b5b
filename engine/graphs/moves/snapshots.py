"""What readers get: an instance's snapshot, a move's outcome, the transitions open to a person.

Frozen values with `to_dict()` (also `json()`): what the HTTP layer returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.graphs.design.model import Edge, Graph, Node
from engine.graphs.moves.states import BranchState, InstanceState
from engine.graphs.tables import ACTIVE


@dataclass(frozen=True)
class BranchSnapshot:
    """A branch as it stands: the node it sits on and the fork scope it belongs to."""

    id: uuid.UUID
    number: int
    status: str
    node_id: uuid.UUID | None
    node_key: str | None
    node_name: str | None
    node_type: str | None
    state_code: str | None
    parent_branch_id: uuid.UUID | None
    fork_scope: uuid.UUID | None
    fork_node_id: uuid.UUID | None
    join_node_id: uuid.UUID | None
    started_at: datetime | None
    completed_at: datetime | None

    @classmethod
    def of(cls, branch: BranchState, graph: Graph) -> BranchSnapshot:
        """The snapshot of a branch of `graph`'s instance."""
        node = graph.nodes.get(branch.node_id) if branch.node_id is not None else None
        return cls(
            id=branch.id,
            number=branch.number,
            status=branch.status,
            node_id=branch.node_id,
            node_key=node.key if node else None,
            node_name=node.title if node else None,
            node_type=node.node_type if node else None,
            state_code=node.state_code if node else None,
            parent_branch_id=branch.parent_branch_id,
            fork_scope=branch.fork_scope,
            fork_node_id=branch.fork_node_id,
            join_node_id=branch.join_node_id,
            started_at=branch.started_at,
            completed_at=branch.completed_at,
        )

    def to_dict(self) -> dict[str, Any]:
        """The branch as JSON values."""
        return _json(self)

    json = to_dict


@dataclass(frozen=True)
class InstanceSnapshot:
    """An instance as it stands, with its active branches (oldest first)."""

    id: uuid.UUID
    template_id: uuid.UUID
    workflow: str
    version: int
    subject_type: str
    subject_key: str
    state_status: str
    status: str
    current_node_id: uuid.UUID | None
    state_code: str | None
    is_active: bool
    is_completed: bool
    submitted_by: str | None
    submitted_at: datetime | None
    completed_at: datetime | None
    branches: tuple[BranchSnapshot, ...]

    @classmethod
    def of(
        cls, instance: InstanceState, graph: Graph, branches: Sequence[BranchState]
    ) -> InstanceSnapshot:
        """The snapshot of `instance`, showing its active branches among `branches`."""
        active = sorted((b for b in branches if b.status == ACTIVE), key=BranchState.order)
        return cls(
            id=instance.id,
            template_id=instance.template_id,
            workflow=graph.name,
            version=graph.version,
            subject_type=instance.subject_type,
            subject_key=instance.subject_key,
            state_status=instance.state_status,
            status=instance.status,
            current_node_id=instance.current_node_id,
            state_code=instance.state_code,
            is_active=instance.is_active,
            is_completed=instance.is_completed,
            submitted_by=instance.submitted_by,
            submitted_at=instance.submitted_at,
            completed_at=instance.completed_at,
            branches=tuple(BranchSnapshot.of(b, graph) for b in active),
        )

    def to_dict(self) -> dict[str, Any]:
        """The instance as JSON values."""
        values = _json(self)
        values["branches"] = [branch.to_dict() for branch in self.branches]
        return values

    json = to_dict


@dataclass(frozen=True)
class AvailableTransition:
    """An edge a user may take now from the state a branch is on."""

    branch_id: uuid.UUID
    transition_id: uuid.UUID
    source_id: uuid.UUID
    source_name: str
    target_id: uuid.UUID
    target_name: str
    target_type: str
    target_state_code: str | None
    label: str
    display_name: str  # the label, else the target's name
    order: int
    comment_required: bool

    @classmethod
    def of(
        cls, branch_id: uuid.UUID, source: Node, edge: Edge, target: Node
    ) -> AvailableTransition:
        """The choice of taking `edge` from `source` to `target` on a branch."""
        return cls(
            branch_id=branch_id,
            transition_id=edge.id,
            source_id=source.id,
            source_name=source.title,
            target_id=target.id,
            target_name=target.title,
            target_type=target.node_type,
            target_state_code=target.state_code,
            label=edge.label,
            display_name=edge.label or target.title,
            order=edge.order,
            comment_required=edge.comment_required,
        )

    def to_dict(self) -> dict[str, Any]:
        """The transition as JSON values."""
        return _json(self)

    json = to_dict


@dataclass(frozen=True)
class TransitionOutcome:
    """What a transition did: moved the branch, or counted a vote toward its threshold."""

    instance: InstanceSnapshot
    moved: bool
    branch_id: uuid.UUID
    target_id: uuid.UUID
    approved_count: int
    required_approvals: int
    threshold: str

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON values."""
        values = _json(self)
        values["instance"] = self.instance.to_dict()
        return values

    json = to_dict


def _json(snapshot: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in snapshot.__dataclass_fields__:
        value = getattr(snapshot, name)
        if isinstance(value, uuid.UUID):
            value = str(value)
        elif isinstance(value, datetime):
            value = value.isoformat()
        values[name] = value
    return values
