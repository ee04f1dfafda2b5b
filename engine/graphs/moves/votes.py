"""Votes and thresholds: how many of a state's assignees must pick the same target.

A person's move casts their vote; the branch moves once the target's votes
reach the state's threshold (`single`, `majority` or `unanimous`), counting
only people who are effective assignees now.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, Text, Uuid, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.graphs.design.model import Node
from engine.graphs.moves.dispatch import dispatch, finish
from engine.graphs.moves.history import state_name
from engine.graphs.moves.states import BranchState
from engine.graphs.moves.unit import Unit
from engine.graphs.moves.writes import VoteCast
from engine.graphs.tables import (
    APPROVAL,
    APPROVED,
    MAJORITY,
    SINGLE,
    STATUS_CHANGE,
    UNANIMOUS,
    GraphTables,
)
from engine.model.companions import array_parameter


@dataclass(frozen=True)
class Tally:
    """A vote's effect: how many votes its target has, how many it needs, and whether it moved."""

    moved: bool
    approved_count: int
    required_approvals: int
    threshold: str


def required_approvals(threshold: str, assignees: int) -> int:
    """Votes a target needs among `assignees` effective assignees (at least one)."""
    if threshold == UNANIMOUS:
        return max(assignees, 1)
    if threshold == MAJORITY:
        return assignees // 2 + 1
    return 1  # SINGLE, and anything a broken graph stored


def counts_votes(threshold: str) -> bool:
    """Whether a vote must be counted: a single vote is always enough."""
    return threshold not in ("", SINGLE)


@lru_cache(maxsize=64)
def others_for_target_statement(tables: GraphTables) -> Select[Any]:
    """Votes cast at :visit_id for :target_id by the people in :eligible other than :approver."""
    votes = tables.table("vote")
    return select(func.count()).where(
        votes.c.visit_id == bindparam("visit_id", type_=Uuid()),
        votes.c.status == APPROVED,
        votes.c.target_node_id == bindparam("target_id", type_=Uuid()),
        votes.c.approver != bindparam("approver", type_=Text()),
        votes.c.approver == func.any(array_parameter("eligible", Text())),
    )


async def votes_for_target(
    conn: AsyncConnection,
    tables: GraphTables,
    visit_id: uuid.UUID,
    target_id: uuid.UUID,
    approver: str,
    eligible: list[str],
) -> int:
    """How many votes `target_id` has at the visit once `approver`'s is cast (under the lock)."""
    params = {
        "visit_id": visit_id,
        "target_id": target_id,
        "approver": approver,
        "eligible": eligible,
    }
    others = (await conn.execute(others_for_target_statement(tables), params)).scalar_one()
    return int(others) + 1


async def vote(
    unit: Unit,
    branch: BranchState,
    source: Node,
    target: Node,
    assignees: list[str],
    comment: str,
) -> Tally:
    """The acting person's vote for `target`; the move once the threshold is met (under the lock).

    The vote and its APPROVAL history (the target's count of the required
    approvals) are written either way; short of the threshold the branch
    stays. At the threshold the visit completes, its other pending votes
    close, a STATUS_CHANGE records the move with the tally, and the branch
    goes on.
    """
    user, visit_id = unit.actor, branch.visit_id
    assert user is not None and visit_id is not None  # a person's move of a state's visit
    threshold = source.approval_threshold
    required = required_approvals(threshold, len(assignees))
    count = 1
    if counts_votes(threshold):
        count = await votes_for_target(unit.conn, unit.tables, visit_id, target.id, user, assignees)
    unit.writes.vote_cast = VoteCast(visit_id, user, target.id, comment)
    moves = {
        "state_code": source.state_code,
        "from_state": state_name(source),
        "to_state": state_name(target),
        "to_state_type": target.node_type,
        "target_state_id": target.id,
        "branch_id": branch.id,
        "comment": comment or None,
    }
    tally = {"approved_count": count, "required_approvals": required, "threshold": threshold}
    # One APPROVAL per vote, with its target's progress toward the threshold.
    message = (
        f"{user} voted to move {source.title!r} to {target.title!r} "
        f"({count} of {required} approvals)."
    )
    unit.record(APPROVAL, message, source, visit_id, **moves, **tally)
    if count < required:
        return Tally(False, count, required, threshold)
    branch.last_code = source.state_code
    unit.end_visit(branch, APPROVED)
    message = f"Moved from {source.title!r} to {target.title!r}."
    unit.record(STATUS_CHANGE, message, source, visit_id, **moves, **tally)
    finish(unit, await dispatch(unit, branch, target))
    return Tally(True, count, required, threshold)
