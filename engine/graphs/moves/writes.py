"""What one move writes, gathered while it decides: the rows, the subject's state, the shape.

The subject's state column is a mirror; the branches are the truth
(`synced_state` says which code it shows).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.events.event import WorkflowEvent
from engine.events.records import EventTables
from engine.graphs.design.model import Graph
from engine.graphs.moves.history import HistoryRow
from engine.graphs.moves.states import BranchState, InstanceState
from engine.graphs.tables import STATE

KEEP = object()  # sync's answer when the subject's state stays as it is


def synced_state(
    graph: Graph, branches: Sequence[BranchState], final_code: str | None
) -> tuple[uuid.UUID | None, object]:
    """The instance's current node and the subject's state code (or KEEP), from live branches."""
    active = sorted((b for b in branches if b.active), key=BranchState.order)
    for branch in active:
        node = graph.nodes.get(branch.node_id) if branch.node_id is not None else None
        if node is not None and node.node_type == STATE and node.state_code:
            return node.id, node.state_code
    if active:
        return active[0].node_id, KEEP
    return None, final_code or None


@dataclass(frozen=True)
class NewVisit:
    """A visit to insert; its iteration is counted by the statement (plus `offset`)."""

    id: uuid.UUID
    branch_id: uuid.UUID
    node_id: uuid.UUID
    offset: int  # 1, or more when this transaction enters the node more than once
    deadline_seconds: float | None


@dataclass(frozen=True)
class VoteCast:
    """A person's vote: inserted, or their pending one updated."""

    visit_id: uuid.UUID
    approver: str
    target_id: uuid.UUID
    comment: str


@dataclass(frozen=True)
class SubjectWrite:
    """The subject's state column to set."""

    cls: type[Any]
    key: str
    code: str | None


@dataclass
class Writes:
    """What one transaction writes, gathered while it decides."""

    instance: InstanceState
    branches: dict[uuid.UUID, BranchState] = field(default_factory=dict)  # touched ones
    visits_new: list[NewVisit] = field(default_factory=list)
    visits_ended: dict[uuid.UUID, str] = field(default_factory=dict)  # id: status
    vote_cast: VoteCast | None = None
    votes_closed: list[uuid.UUID] = field(default_factory=list)  # visits whose pending close
    votes_new: list[tuple[uuid.UUID, str]] = field(default_factory=list)  # visit, approver
    history: list[HistoryRow] = field(default_factory=list)
    subject: SubjectWrite | None = None
    timers_new: list[tuple[uuid.UUID, uuid.UUID, float]] = field(default_factory=list)
    timers_cancelled: list[uuid.UUID] = field(default_factory=list)
    instance_changed: bool = False
    events: Sequence[WorkflowEvent] = ()  # the notifications this write stores itself
    outbox: EventTables | None = None  # the event tables they are stored in

    def publish(self, outbox: EventTables, events: Sequence[WorkflowEvent]) -> None:
        """Store `events` in `outbox`'s tables with the rest of this write (one statement)."""
        self.outbox, self.events = outbox, events


@dataclass(frozen=True)
class Shape:
    """Which kinds of rows a statement writes: the key its text is built and kept under."""

    instance_new: bool
    instance_changed: bool
    branches_new: bool
    branches_changed: bool
    visits_new: bool
    visits_ended: bool
    vote_cast: bool
    votes_closed: bool
    votes_new: bool
    history: bool
    subject: type[Any] | None
    timers_new: bool
    timers_cancelled: bool
    single_keys: bool = False  # each part found by key has one row: its key is a scalar
    events: EventTables | None = None  # the event tables the notifications are stored in

    @property
    def empty(self) -> bool:
        """Whether there is nothing to write."""
        return not any(value for name, value in vars(self).items() if name != "single_keys")

    @classmethod
    def of(cls, writes: Writes) -> Shape:
        """The shape of `writes`."""
        branches = list(writes.branches.values())
        changed = sum(1 for b in branches if b.changed and not b.new)
        keyed = (changed, len(writes.visits_ended), len(writes.votes_closed))
        return cls(
            instance_new=writes.instance.new,
            instance_changed=writes.instance_changed and not writes.instance.new,
            branches_new=any(b.new for b in branches),
            branches_changed=any(b.changed and not b.new for b in branches),
            visits_new=bool(writes.visits_new),
            visits_ended=bool(writes.visits_ended),
            vote_cast=writes.vote_cast is not None,
            votes_closed=bool(writes.votes_closed),
            votes_new=bool(writes.votes_new),
            history=bool(writes.history),
            subject=writes.subject.cls if writes.subject is not None else None,
            timers_new=bool(writes.timers_new),
            timers_cancelled=bool(writes.timers_cancelled),
            single_keys=all(count <= 1 for count in keyed),
            events=writes.outbox if writes.events else None,
        )
