"""One move's transaction in memory: the locked instance, its branches, what it will write."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from engine.base.errors import ConfigurationError, NotFoundError
from engine.events.event import WorkflowEvent
from engine.graphs.design.model import Graph, Node
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.directory import Directory
from engine.graphs.moves.history import HistoryRow, details
from engine.graphs.moves.locks import instance_branches, read_branch
from engine.graphs.moves.states import BranchState, InstanceState
from engine.graphs.moves.subjects import key_values, subject_class
from engine.graphs.moves.writes import NewVisit, Writes
from engine.graphs.tables import ACTIVE, COMPLETED, GraphTables

_UNREAD = object()  # the subject row, before a condition first asks for it


@dataclass
class Unit:
    """One transaction's decisions: the instance, its branches, what it will write."""

    conn: AsyncConnection
    tables: GraphTables
    graph: Graph
    writes: Writes
    directory: Directory
    conditions: ConditionRegistry
    actor: str | None  # the user the move is for (None: the engine, as a deadline escalates)
    acted_by: str | None = None  # who acted in the actor's stead, when someone else did
    known: dict[uuid.UUID, BranchState] = field(default_factory=dict)
    events: list[WorkflowEvent] = field(default_factory=list)
    starting: bool = False  # the submit's first state says "Workflow started in state"
    spared_timer: uuid.UUID | None = None  # an escalating visit's own timer: its step ends it
    subject_row: Any = _UNREAD
    entries: Counter[uuid.UUID] = field(default_factory=Counter)  # node entries here
    all_read: bool = False  # every branch of the instance is in `known`
    before: InstanceState | None = None  # the instance as locked
    version_active: bool = False  # the instance's version is the active one (False: unknown)

    def __post_init__(self) -> None:
        self.before = dataclasses.replace(self.writes.instance)

    @property
    def instance(self) -> InstanceState:
        """The instance as this transaction will leave it."""
        return self.writes.instance

    def branches(self) -> list[BranchState]:
        """Every branch this transaction knows (its instance's active ones at least)."""
        return list(self.known.values())

    def active(self) -> list[BranchState]:
        """The active branches, oldest first."""
        return sorted((b for b in self.known.values() if b.active), key=BranchState.order)

    def touch(self, branch: BranchState) -> None:
        """Mark `branch` to be written."""
        if not branch.new:
            branch.changed = True
        self.writes.branches[branch.id] = branch

    def new_branch(self, node_id: uuid.UUID, **scope: Any) -> BranchState:
        """A branch started by this transaction, numbered after the instance's others."""
        self.instance.branch_count += 1
        branch = BranchState(
            id=uuid.uuid4(),
            number=self.instance.branch_count,
            node_id=node_id,
            status=ACTIVE,
            new=True,
            **scope,
        )
        self.known[branch.id] = branch
        self.touch(branch)
        return branch

    def complete(self, branch: BranchState, node: Node) -> None:
        """The branch ends on `node` (a fork, a join or an end)."""
        branch.node_id = node.id
        branch.status = COMPLETED
        branch.completing = True
        self.touch(branch)

    def enter(self, branch: BranchState, node: Node) -> uuid.UUID:
        """A new visit of `branch` to `node`, with its deadline timer; the visit's id."""
        visit_id = uuid.uuid4()
        self.entries[node.id] += 1
        seconds = float(node.deadline_seconds) if node.deadline_seconds else None
        self.writes.visits_new.append(
            NewVisit(visit_id, branch.id, node.id, self.entries[node.id], seconds)
        )
        if seconds is not None:
            if self.tables.timer is None:
                raise ConfigurationError(
                    f"State {node.title!r} has a deadline but no GraphTimer is mapped: map "
                    "class Timer(Base, GraphTimer) beside the other graph tables."
                )
            self.writes.timers_new.append((visit_id, branch.id, seconds))
        branch.visit_id = visit_id
        return visit_id

    def end_visit(self, branch: BranchState, status: str) -> None:
        """The branch's current visit ends: its pending votes close, its timer is cancelled."""
        visit_id = branch.visit_id
        if visit_id is None:
            return
        self.writes.visits_ended[visit_id] = status
        node = self.graph.nodes.get(branch.node_id) if branch.node_id is not None else None
        if node is None or self.may_have_pending(node):
            self.writes.votes_closed.append(visit_id)
        if node is not None and node.deadline_seconds and visit_id != self.spared_timer:
            self.writes.timers_cancelled.append(visit_id)
        branch.visit_id = None

    def may_have_pending(self, node: Node) -> bool:
        """Whether a visit of `node` may have pending votes other than the one cast now.

        Entering a state writes a pending vote for each assignee its users and
        groups named then, and nothing else writes one: a state whose only
        user is the voter, and no group, has none left to close.
        """
        cast = self.writes.vote_cast
        voter = cast.approver if cast is not None else None
        return bool(node.assignee_groups) or any(user != voter for user in node.assignee_users)

    def record(
        self,
        action_type: str,
        message: str,
        node: Node | None = None,
        visit_id: uuid.UUID | None = None,
        **metadata: Any,
    ) -> None:
        """A history row, written with the transaction."""
        self.writes.history.append(
            HistoryRow(
                action_type=action_type,
                message=message,
                step_name=node.title if node is not None else "",
                actor=self.actor,
                acted_by=self.acted_by,
                visit_id=visit_id,
                details=details(**metadata),
            )
        )

    async def branch(self, branch_id: uuid.UUID) -> BranchState | None:
        """A branch of the instance, read if this transaction has not seen it."""
        found = self.known.get(branch_id)
        if found is None and not self.all_read:
            found = await read_branch(self.conn, self.tables, branch_id)
            if found is not None:
                self.known[found.id] = found
        return found

    async def read_all_branches(self) -> None:
        """Know every branch of the instance (a join walks completed parents)."""
        if self.all_read:
            return
        for branch in await instance_branches(self.conn, self.tables, self.instance.id):
            self.known.setdefault(branch.id, branch)
        self.all_read = True

    async def subject(self) -> Any:
        """The subject row, read once (None when its class is not mapped in this process)."""
        if self.subject_row is _UNREAD:
            self.subject_row = await read_subject(self.conn, self.instance)
        return self.subject_row


async def read_subject(conn: AsyncConnection, instance: InstanceState) -> Any:
    """The instance's subject as a mapped row, through the transaction's connection."""
    try:
        cls = subject_class(instance.subject_type)
    except NotFoundError:
        return None
    key = key_values(cls, instance.subject_key)
    # The session joins the move's transaction: its close leaves it, and the lock, alone.
    async with AsyncSession(bind=conn) as session:
        return await session.get(cls, key if len(key) > 1 else key[0])
