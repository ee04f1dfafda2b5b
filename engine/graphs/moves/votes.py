"""Votes and thresholds: how many of a state's assignees must pick the same target.

A person's move casts their vote, once a visit; the branch moves once the
target's votes reach the state's threshold (`single`, `majority` or
`unanimous`) of the directory's assignees now, whoever votes. A vote counts
while its voter is listed, or when their credential's groups admitted them.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, Text, Uuid, and_, bindparam, exists, false, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.base.errors import AlreadyVotedError
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


THROUGH_GROUPS = "through_groups"  # an APPROVAL's mark: its voter came by their credential


def by_credential(tables: GraphTables, votes: Any) -> Any:
    """Whether a cast vote's voter was admitted by their credential's groups (its APPROVAL
    says so): such a vote counts though the directory does not list its voter."""
    history = tables.table("history")
    return exists().where(
        history.c.instance_id == votes.c.instance_id,
        history.c.visit_id == votes.c.visit_id,
        history.c.actor == votes.c.approver,
        history.c.action_type == APPROVAL,
        history.c["metadata"][THROUGH_GROUPS].as_boolean(),
    )


def counted_voters(cast: Iterable[tuple[str, bool]], listed: Collection[str]) -> list[str]:
    """The voters whose votes count, of (voter, admitted by credential) pairs: those the
    directory lists now, and those their credential admitted (`tally_statement`'s rule)."""
    return [voter for voter, through in cast if through or voter in listed]


@lru_cache(maxsize=64)
def tally_statement(tables: GraphTables) -> Select[int, Any]:
    """At :visit_id, the other votes for :target_id that count, and whether :approver voted.

    A vote counts when its voter is in :eligible (the directory's assignees now)
    or was admitted by their credential's groups when they voted.
    """
    votes = tables.table("vote")
    approver = bindparam("approver", type_=Text())
    counted = and_(
        votes.c.target_node_id == bindparam("target_id", type_=Uuid()),
        votes.c.approver != approver,
        or_(
            votes.c.approver == func.any(array_parameter("eligible", Text())),
            by_credential(tables, votes),
        ),
    )
    return select(
        func.count().filter(counted),
        func.coalesce(func.bool_or(votes.c.approver == approver), false()),
    ).where(votes.c.visit_id == bindparam("visit_id", type_=Uuid()), votes.c.status == APPROVED)


async def votes_for_target(
    conn: AsyncConnection,
    tables: GraphTables,
    visit_id: uuid.UUID,
    target_id: uuid.UUID,
    approver: str,
    eligible: list[str],
) -> int:
    """How many votes `target_id` has at the visit once `approver`'s is cast (under the lock);
    AlreadyVotedError, before anything is written, when `approver` has voted at the visit."""
    params = {
        "visit_id": visit_id,
        "target_id": target_id,
        "approver": approver,
        "eligible": eligible,
    }
    others, voted = (await conn.execute(tally_statement(tables), params)).one()
    if voted:
        raise AlreadyVotedError(f"{approver!r} has voted at this state already: one vote each.")
    return int(others) + 1


@lru_cache(maxsize=64)
def voted_statement(tables: GraphTables) -> Select[Any]:
    """The branches of :instance_id whose current visit has a vote cast by :approver."""
    visits, votes = tables.table("visit"), tables.table("vote")
    return (
        select(visits.c.branch_id)
        .join(votes, votes.c.visit_id == visits.c.id)
        .where(
            votes.c.instance_id == bindparam("instance_id", type_=Uuid()),
            votes.c.approver == bindparam("approver", type_=Text()),
            votes.c.status == APPROVED,
            visits.c.is_current,
        )
    )


@lru_cache(maxsize=64)
def current_votes_statement(tables: GraphTables) -> Select[Any]:
    """The votes cast at the current visits of :instance_id, by voter.

    Each says whether its voter's credential admitted them (`counted_voters`).
    """
    visits, votes = tables.table("visit"), tables.table("vote")
    return (
        select(
            visits.c.branch_id,
            votes.c.target_node_id,
            votes.c.approver,
            by_credential(tables, votes).label("through_groups"),
        )
        .join(visits, votes.c.visit_id == visits.c.id)
        .where(
            votes.c.instance_id == bindparam("instance_id", type_=Uuid()),
            visits.c.is_current,
            votes.c.status == APPROVED,  # a cast vote; pending ones are not votes yet
            votes.c.target_node_id.is_not(None),
        )
        .order_by(votes.c.approver)
    )


CastVotes = dict[uuid.UUID, dict[uuid.UUID, list[tuple[str, bool]]]]


async def current_votes(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID
) -> CastVotes:
    """The votes cast at each branch's current visit: branch to target node to (voter,
    admitted by credential) pairs, for `counted_voters`."""
    rows = await conn.execute(current_votes_statement(tables), {"instance_id": instance_id})
    cast: CastVotes = {}
    for row in rows:
        voters = cast.setdefault(row.branch_id, {}).setdefault(row.target_node_id, [])
        voters.append((row.approver, bool(row.through_groups)))
    return cast


async def voted_branches(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID, approver: str
) -> set[uuid.UUID]:
    """The branches where `approver` has voted at the current visit: nothing left to offer."""
    rows = await conn.execute(
        voted_statement(tables), {"instance_id": instance_id, "approver": approver}
    )
    return {row.branch_id for row in rows}


async def vote(
    unit: Unit,
    branch: BranchState,
    source: Node,
    target: Node,
    listed: list[str],
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
    required = required_approvals(threshold, len(listed))  # never sized by who votes
    through_groups = user not in listed or None  # admitted by their credential's groups
    count = 1
    if counts_votes(threshold):
        count = await votes_for_target(unit.conn, unit.tables, visit_id, target.id, user, listed)
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
    marked = {THROUGH_GROUPS: through_groups}
    # One APPROVAL per vote, with its target's progress toward the threshold.
    message = (
        f"{user} voted to move {source.title!r} to {target.title!r} "
        f"({count} of {required} approvals)."
    )
    unit.record(APPROVAL, message, source, visit_id, **moves, **tally, **marked)
    if count < required:
        return Tally(False, count, required, threshold)
    branch.last_code = source.state_code
    unit.end_visit(branch, APPROVED)
    message = f"Moved from {source.title!r} to {target.title!r}."
    unit.record(STATUS_CHANGE, message, source, visit_id, **moves, **tally)
    finish(unit, await dispatch(unit, branch, target))
    return Tally(True, count, required, threshold)
