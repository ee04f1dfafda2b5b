"""Graph workflows' tables, as mixins the application maps on its own base.

class Template(Base, GraphTemplate): pass        # duly_graph_templates
class Node(Base, GraphNode): pass                # duly_graph_nodes
class Transition(Base, GraphTransition): pass    # duly_graph_transitions
class Instance(Base, GraphInstance): pass        # duly_graph_instances
class Branch(Base, GraphBranch): pass            # duly_graph_branches
class Visit(Base, GraphVisit): pass              # duly_graph_visits
class Vote(Base, GraphVote): pass                # duly_graph_votes
class History(Base, GraphHistory): pass          # duly_graph_history
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from engine.base.errors import ConfigurationError
from engine.base.owned_tables import declare_owned_tables

TEMPLATES = "duly_graph_templates"
NODES = "duly_graph_nodes"
TRANSITIONS = "duly_graph_transitions"
INSTANCES = "duly_graph_instances"
BRANCHES = "duly_graph_branches"
VISITS = "duly_graph_visits"
VOTES = "duly_graph_votes"
HISTORY = "duly_graph_history"
TIMERS = "duly_graph_timers"

# Node types.
START = "start"
STATE = "state"
CONDITION = "condition"
FORK = "fork"
JOIN = "join"
END = "end"
NODE_TYPES = (START, STATE, CONDITION, FORK, JOIN, END)

# Approval thresholds of a state: one vote, more than half, every assignee.
SINGLE = "single"
MAJORITY = "majority"
UNANIMOUS = "unanimous"
THRESHOLDS = (SINGLE, MAJORITY, UNANIMOUS)

# Who may submit a subject to a template: anyone, only the subject's owner, or a role.
ANY_SUBMITTER = "any"
OWNER_SUBMITS = "owner"
SUBMITTER_ROLES = ("viewer", "operator", "designer", "admin")
SUBMITTERS = (ANY_SUBMITTER, OWNER_SUBMITS, *SUBMITTER_ROLES)

# Lifecycles: of an instance (`state_status`) and of a branch.
ACTIVE = "active"
COMPLETED = "completed"
CANCELLED = "cancelled"
LIFECYCLES = (ACTIVE, COMPLETED, CANCELLED)

# An instance's mirrored status, as the subject would show it.
IN_REVIEW = "in_review"
APPROVED = "approved"
REJECTED = "rejected"

# A visit's and a vote's status.
PENDING = "pending"
# (APPROVED, REJECTED and COMPLETED as above)

# History action types.
CREATION = "creation"
ASSIGNMENT = "assignment"
APPROVAL = "approval"
STATUS_CHANGE = "status_change"
COMPLETION = "completion"
NOTIFICATION = "notification"
ACTION_TYPES = (CREATION, ASSIGNMENT, APPROVAL, STATUS_CHANGE, COMPLETION, NOTIFICATION)

SHORT = 16  # the length of every short code column


class GraphTable:
    """What every graph mixin shares: mapped on a base, it declares duly's own tables
    there too (`duly_clock` first: every move reads the database clock), as a workflow
    does, so a base that maps the mixins by hand creates them with `create_all`."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        # Declarative bases map the class before this runs; unmapped subclasses are skipped.
        table = cls.__dict__.get("__table__")
        if isinstance(table, Table):
            declare_owned_tables(table.metadata)


def _fk(table: str, *, ondelete: str) -> ForeignKey:
    return ForeignKey(f"{table}.id", ondelete=ondelete)


class GraphTemplate(GraphTable):
    """Map onto your base: one version of a named graph."""

    __tablename__ = TEMPLATES

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, default=1)
    is_latest: Mapped[bool] = mapped_column(Boolean, default=True)
    is_active: Mapped[bool] = mapped_column(Boolean, default=False)
    cloned_from: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(TEMPLATES, ondelete="SET NULL"), default=None
    )
    description: Mapped[str] = mapped_column(Text, default="")
    # The state vocabulary: the codes a state node may carry.
    state_choices: Mapped[list[str]] = mapped_column(JSONB, default=list)
    # The designer's last layout (nodes and connections), used while it matches the graph.
    design: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Whether the one who submitted an instance is refused every move and vote of it.
    forbid_self_approval: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (
            UniqueConstraint("name", "version", name=f"uq_{TEMPLATES}_name_version"),
            # One active version per name: activation deactivates the others first.
            Index(
                f"uq_{TEMPLATES}_active",
                "name",
                unique=True,
                postgresql_where=text("is_active"),
            ),
        )


class GraphNode(GraphTable):
    """Map onto your base: a node of a template version's graph."""

    __tablename__ = NODES

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    template_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, _fk(TEMPLATES, ondelete="CASCADE"), index=True
    )
    key: Mapped[str] = mapped_column(Text)  # the designer's id for the node ("step-3")
    node_type: Mapped[str] = mapped_column(String(SHORT))
    name: Mapped[str] = mapped_column(Text, default="")
    order: Mapped[int] = mapped_column(Integer, default=0)
    state_code: Mapped[str | None] = mapped_column(Text, default=None)
    approval_threshold: Mapped[str] = mapped_column(String(SHORT), default=SINGLE)
    assignee_users: Mapped[list[str]] = mapped_column(JSONB, default=list)
    assignee_groups: Mapped[list[str]] = mapped_column(JSONB, default=list)
    condition: Mapped[str | None] = mapped_column(Text, default=None)  # a predicate's name
    matched_join_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(NODES, ondelete="SET NULL"), default=None
    )
    deadline_seconds: Mapped[int | None] = mapped_column(Integer, default=None)
    assignment_template: Mapped[str | None] = mapped_column(Text, default=None)
    notify_originator: Mapped[bool] = mapped_column(Boolean, default=False)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (UniqueConstraint("template_id", "key", name=f"uq_{NODES}_template_key"),)


class GraphTransition(GraphTable):
    """Map onto your base: an edge of a template version's graph."""

    __tablename__ = TRANSITIONS

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    template_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, _fk(TEMPLATES, ondelete="CASCADE"), index=True
    )
    source_id: Mapped[uuid.UUID] = mapped_column(Uuid, _fk(NODES, ondelete="CASCADE"))
    target_id: Mapped[uuid.UUID] = mapped_column(Uuid, _fk(NODES, ondelete="CASCADE"))
    label: Mapped[str] = mapped_column(String(150), default="")
    order: Mapped[int] = mapped_column(Integer, default=0)
    condition: Mapped[str | None] = mapped_column(Text, default=None)  # a manual guard's name
    condition_result: Mapped[str | None] = mapped_column(String(5), default=None)  # true/false
    comment_required: Mapped[bool] = mapped_column(Boolean, default=False)
    # Taken by the engine when the source state's approval deadline passes.
    escalation: Mapped[bool] = mapped_column(Boolean, default=False)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (
            UniqueConstraint(
                "template_id", "source_id", "target_id", name=f"uq_{TRANSITIONS}_edge"
            ),
        )


class GraphInstance(GraphTable):
    """Map onto your base: one subject's run through one template version."""

    __tablename__ = INSTANCES

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    # Pinned: a template version with instances cannot be deleted.
    template_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, _fk(TEMPLATES, ondelete="RESTRICT"), index=True
    )
    subject_type: Mapped[str] = mapped_column(Text)  # the subject's table
    subject_key: Mapped[str] = mapped_column(Text)  # its primary key, as text
    state_status: Mapped[str] = mapped_column(String(SHORT), default=ACTIVE)
    status: Mapped[str] = mapped_column(String(SHORT), default=IN_REVIEW)
    current_node_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(NODES, ondelete="SET NULL"), default=None
    )
    state_code: Mapped[str | None] = mapped_column(Text, default=None)  # as synced to the subject
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    is_completed: Mapped[bool] = mapped_column(Boolean, default=False)
    branch_count: Mapped[int] = mapped_column(Integer, default=0)  # numbers the branches
    submitted_by: Mapped[str | None] = mapped_column(Text, default=None)
    submitted_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (
            # A subject has at most one active instance, even under concurrent submits.
            Index(
                f"uq_{INSTANCES}_active_subject",
                "subject_type",
                "subject_key",
                unique=True,
                postgresql_where=text("is_active"),
            ),
            Index(f"ix_{INSTANCES}_subject", "subject_type", "subject_key"),
        )


class GraphBranch(GraphTable):
    """Map onto your base: a token on a node of an instance's graph."""

    __tablename__ = BRANCHES

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    instance_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, _fk(INSTANCES, ondelete="CASCADE"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)  # 1, 2, ... per instance: the start order
    current_node_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(NODES, ondelete="RESTRICT"), default=None
    )
    parent_branch_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(BRANCHES, ondelete="SET NULL"), default=None
    )
    fork_scope: Mapped[uuid.UUID | None] = mapped_column(Uuid, default=None, index=True)
    fork_node_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(NODES, ondelete="SET NULL"), default=None
    )
    join_node_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(NODES, ondelete="SET NULL"), default=None
    )
    status: Mapped[str] = mapped_column(String(SHORT), default=ACTIVE)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)


class GraphVisit(GraphTable):
    """Map onto your base: one entry of a branch into a node."""

    __tablename__ = VISITS

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    # Indexed by (instance_id, node_id) below, which serves the instance's lookups too.
    instance_id: Mapped[uuid.UUID] = mapped_column(Uuid, _fk(INSTANCES, ondelete="CASCADE"))
    branch_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(BRANCHES, ondelete="SET NULL"), default=None, index=True
    )
    node_id: Mapped[uuid.UUID] = mapped_column(Uuid, _fk(NODES, ondelete="RESTRICT"))
    status: Mapped[str] = mapped_column(String(SHORT), default=PENDING)
    is_current: Mapped[bool] = mapped_column(Boolean, default=True)
    iteration: Mapped[int] = mapped_column(Integer, default=1)  # per (instance, node)
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    entered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        # A new visit counts the earlier visits of its node (its iteration).
        return (Index(f"ix_{VISITS}_instance_node", "instance_id", "node_id"),)


class GraphVote(GraphTable):
    """Map onto your base: one assignee's vote at a visit (pending until cast)."""

    __tablename__ = VOTES

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    visit_id: Mapped[uuid.UUID] = mapped_column(Uuid, _fk(VISITS, ondelete="CASCADE"))
    instance_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, _fk(INSTANCES, ondelete="CASCADE"), index=True
    )
    approver: Mapped[str] = mapped_column(Text)  # a user id
    status: Mapped[str] = mapped_column(String(SHORT), default=PENDING)
    target_node_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(NODES, ondelete="SET NULL"), default=None
    )
    is_available: Mapped[bool] = mapped_column(Boolean, default=True)
    comment: Mapped[str] = mapped_column(Text, default="")
    acted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (UniqueConstraint("visit_id", "approver", name=f"uq_{VOTES}_visit_approver"),)


class GraphHistory(GraphTable):
    """Map onto your base: the audit trail, one row per action, never changed."""

    __tablename__ = HISTORY

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    instance_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, _fk(INSTANCES, ondelete="CASCADE"), index=True
    )
    visit_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, _fk(VISITS, ondelete="SET NULL"), default=None
    )
    action_type: Mapped[str] = mapped_column(String(SHORT))
    actor: Mapped[str | None] = mapped_column(Text, default=None)
    step_name: Mapped[str] = mapped_column(Text, default="")
    message: Mapped[str] = mapped_column(Text, default="")
    # `metadata` is the declarative base's own attribute; the column keeps the name `metadata`.
    details: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Who acted, when not `actor`: an admin acting on the actor's behalf.
    acted_by: Mapped[str | None] = mapped_column(Text, default=None)


@dataclass(frozen=True)
class GraphTables:
    """The classes of one application's graph tables (the timer's may be None)."""

    template: type[Any]
    node: type[Any]
    transition: type[Any]
    instance: type[Any]
    branch: type[Any]
    visit: type[Any]
    vote: type[Any]
    history: type[Any]
    timer: type[Any] | None = None

    def table(self, role: str) -> Table:
        """The Core table of one role ("template", "node", ...)."""
        return getattr(self, role).__table__  # type: ignore[no-any-return]


_MIXINS: dict[str, type[Any]] = {
    "template": GraphTemplate,
    "node": GraphNode,
    "transition": GraphTransition,
    "instance": GraphInstance,
    "branch": GraphBranch,
    "visit": GraphVisit,
    "vote": GraphVote,
    "history": GraphHistory,
}


def graph_tables(base: type[Any]) -> GraphTables:
    """The graph classes mapped on `base`'s registry (the timer's too, if mapped)."""
    mapped = [mapper.class_ for mapper in base.registry.mappers]

    def one(role: str, mixin: type[Any], required: bool = True) -> type[Any] | None:
        found = [cls for cls in mapped if issubclass(cls, mixin)]
        if not found:
            if not required:
                return None
            raise ConfigurationError(
                f"No {mixin.__name__} is mapped on {base.__name__}: map every graph table "
                f"on the same base (class {role.title()}(Base, {mixin.__name__}): pass)."
            )
        chosen: type[Any] = found[-1]
        return chosen

    classes = {role: one(role, mixin) for role, mixin in _MIXINS.items()}
    # The timer mixin lives with the engine's timers; found by its table name here.
    timers = [cls for cls in mapped if getattr(cls, "__tablename__", None) == TIMERS]
    return GraphTables(**classes, timer=timers[-1] if timers else None)  # type: ignore[arg-type]
