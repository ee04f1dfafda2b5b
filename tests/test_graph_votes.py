"""Votes and thresholds of a state: what approvers may do.

- required approvals: single 1, majority more than half, unanimous all:
  test_required_approvals
- single: any one effective assignee (a group member too) moves the branch:
  test_a_single_threshold_moves_on_the_first_vote
- majority: a vote short of it is recorded (one APPROVAL per vote, with its
  target's count and the required approvals) and the branch stays; the vote
  that reaches it moves the branch, with the threshold in the STATUS_CHANGE:
  test_a_majority_moves_once_more_than_half_agree
- votes for different targets do not add up: test_votes_for_different_targets_do_not_add_up
- unanimous: every effective assignee, groups expanded through the
  directory: test_unanimous_needs_every_assignee
- one vote a person a visit: a second (for the same target or another) is
  refused (AlreadyVotedError, 409 ALREADY_VOTED), writes nothing, and the
  voter is offered no move there: test_a_second_vote_of_the_same_person_is_refused
- the votes needed are the directory's count, whoever votes: a voter admitted
  by their credential's groups does not raise it, and their vote keeps
  counting when another votes: test_the_votes_needed_do_not_depend_on_who_votes
- the move closes the other pending votes; votes cast for another target
  stay as cast: test_the_move_closes_pending_votes_and_keeps_cast_ones
- the assignees are those of the directory now: a person who joined a group
  after the state was entered may vote (their vote is inserted), one who left
  may not, and their earlier vote no longer counts:
  test_the_directory_decides_who_votes_now
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Collection
from typing import Any

import pytest

from engine.base.errors import AlreadyVotedError, StateWorkflowError
from engine.graphs.design.model import Graph
from engine.graphs.moves.actors import Actor
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.snapshots import InstanceSnapshot
from engine.graphs.moves.votes import required_approvals
from engine.graphs.tables import END, START, STATE
from functions.http.errors import status_of
from tests.apps import graphs as app
from tests.conftest import Database
from tests.graph_helpers import graph_of
from tests.graph_world import TABLES, World, make_world, node_id, only_branch

GROUP = ["amy", "ben", "cy"]


def voting(threshold: str, users: list[str] | None = None) -> tuple[dict[str, Any], list[Any]]:
    nodes = {
        "start": START,
        "vote": {
            "type": STATE,
            "state_code": "vote",
            "approval_threshold": threshold,
            "assignee_users": users or [],
            "assignee_groups": ["board"],
        },
        "yes": (STATE, "yes", ["ann"]),
        "no": (STATE, "no", ["ann"]),
        "end": END,
    }
    edges = [("start", "vote"), ("vote", "yes"), ("vote", "no"), ("yes", "end"), ("no", "end")]
    return nodes, edges


@pytest.fixture
async def world(db: Database) -> AsyncIterator[World]:
    async for made in make_world(db, groups={"board": GROUP}):
        yield made


async def open_vote(
    world: World, threshold: str, users: list[str] | None = None
) -> tuple[Graph, InstanceSnapshot]:
    nodes, edges = voting(threshold, users)
    graph = await world.store(graph_of(nodes, edges, name="vote"))
    instance = await world.runtime.submit(await world.claim(), "sam", template_name="vote")
    return graph, instance


async def cast(
    world: World, instance: InstanceSnapshot, graph: Graph, target: str, user: str | Actor
) -> Any:
    return await world.runtime.transition_branch(
        instance.id, only_branch(instance), node_id(graph, target), user
    )


async def written(world: World) -> tuple[int, list[tuple[Any, ...]]]:
    """The history's length and every vote as it stands: what a refusal must leave alone."""
    votes = await world.rows(app.Vote, order=app.Vote.approver)
    shown = [(v.approver, v.status, v.target_node_id, v.acted_at) for v in votes]
    return len(await world.rows(app.History)), shown


def test_required_approvals() -> None:
    assert [required_approvals("single", n) for n in (1, 2, 5)] == [1, 1, 1]
    assert [required_approvals("majority", n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert [required_approvals("unanimous", n) for n in (1, 2, 5)] == [1, 2, 5]


async def test_a_single_threshold_moves_on_the_first_vote(world: World) -> None:
    graph, instance = await open_vote(world, "single")
    outcome = await cast(world, instance, graph, "yes", "ben")
    assert outcome.moved and (outcome.approved_count, outcome.required_approvals) == (1, 1)
    assert outcome.instance.state_code == "yes"


async def test_a_majority_moves_once_more_than_half_agree(world: World) -> None:
    graph, instance = await open_vote(world, "majority")
    first = await cast(world, instance, graph, "yes", "amy")
    assert not first.moved
    assert (first.approved_count, first.required_approvals, first.threshold) == (
        1,
        2,
        "majority",
    )
    assert first.instance.state_code == "vote"
    progress = (await world.runtime.history(instance.id))[-1]
    assert (progress.action_type, progress.actor) == ("approval", "amy")
    assert progress.metadata["approved_count"] == 1
    assert progress.metadata["required_approvals"] == 2
    assert progress.metadata["target_state_id"] == str(node_id(graph, "yes"))
    second = await cast(world, instance, graph, "yes", "cy")
    assert second.moved and second.instance.state_code == "yes"
    move = next(
        h for h in await world.runtime.history(instance.id) if h.action_type == "status_change"
    )
    assert (
        move.metadata["approved_count"],
        move.metadata["required_approvals"],
        move.metadata["threshold"],
        move.actor,
    ) == (2, 2, "majority", "cy")


async def test_votes_for_different_targets_do_not_add_up(world: World) -> None:
    graph, instance = await open_vote(world, "majority")
    assert not (await cast(world, instance, graph, "yes", "amy")).moved
    assert not (await cast(world, instance, graph, "no", "ben")).moved
    decided = await cast(world, instance, graph, "no", "cy")
    assert decided.moved and decided.instance.state_code == "no"


async def test_unanimous_needs_every_assignee(world: World) -> None:
    graph, instance = await open_vote(world, "unanimous", users=["ann"])
    for person in ["amy", "ben", "ann"]:
        outcome = await cast(world, instance, graph, "yes", person)
        assert not outcome.moved and outcome.required_approvals == 4
    assert outcome.approved_count == 3
    last = await cast(world, instance, graph, "yes", "cy")
    assert last.moved and last.approved_count == 4


@pytest.mark.parametrize("target", ["yes", "no"])
async def test_a_second_vote_of_the_same_person_is_refused(world: World, target: str) -> None:
    graph, instance = await open_vote(world, "majority")
    await cast(world, instance, graph, "yes", "amy")
    before = await written(world)
    with pytest.raises(AlreadyVotedError) as refused:
        await cast(world, instance, graph, target, "amy")
    assert (refused.value.code, status_of(refused.value)) == ("ALREADY_VOTED", 409)
    assert await written(world) == before
    offered = await world.runtime.transitions_for(instance.id, "amy")
    assert offered == []  # nothing left to offer her at this state
    assert [t.display_name for t in await world.runtime.transitions_for(instance.id, "ben")]


async def test_the_votes_needed_do_not_depend_on_who_votes(world: World) -> None:
    # The board is amy, ben and cy in the directory; gil's credential says board too.
    graph, instance = await open_vote(world, "majority")
    gil = Actor(user="gil", groups=frozenset({"board"}))
    first = await cast(world, instance, graph, "yes", gil)
    assert (first.moved, first.approved_count, first.required_approvals) == (False, 1, 2)
    second = await cast(world, instance, graph, "yes", "amy")  # gil's vote still counts
    assert (second.moved, second.approved_count, second.required_approvals) == (True, 2, 2)
    tallies = [
        (h.details["approved_count"], h.details["required_approvals"])
        for h in await world.rows(app.History, app.History.action_type == "approval")
    ]
    assert sorted(tallies) == [(1, 2), (2, 2)]


async def test_the_move_closes_pending_votes_and_keeps_cast_ones(world: World) -> None:
    graph, instance = await open_vote(world, "majority")
    await cast(world, instance, graph, "no", "amy")
    await cast(world, instance, graph, "yes", "ben")
    await cast(world, instance, graph, "yes", "cy")
    [visit] = await world.rows(app.Visit, app.Visit.node_id == node_id(graph, "vote"))
    votes = {v.approver: v for v in await world.rows(app.Vote, app.Vote.visit_id == visit.id)}
    assert (votes["amy"].status, votes["amy"].target_node_id, votes["amy"].is_available) == (
        "approved",
        node_id(graph, "no"),
        True,
    )
    assert {votes[p].target_node_id for p in ("ben", "cy")} == {node_id(graph, "yes")}
    assert all(v.acted_at is not None for v in votes.values())
    with pytest.raises(StateWorkflowError):  # the state is left: no more votes on it
        await cast(world, instance, graph, "no", "amy")


class Members:
    """A directory whose groups change while a test runs."""

    def __init__(self, groups: dict[str, list[str]]) -> None:
        self.groups = groups

    async def members(self, group: str) -> Collection[str]:
        return list(self.groups.get(group, []))


async def test_the_directory_decides_who_votes_now(world: World) -> None:
    directory = Members({"board": ["amy", "ben", "cy"]})
    runtime = GraphRuntime(TABLES, directory=directory, events=world.registry)
    nodes, edges = voting("majority")
    graph = await world.store(graph_of(nodes, edges, name="vote"))
    instance = await runtime.submit(await world.claim(), "sam", template_name="vote")
    branch, yes = only_branch(instance), node_id(graph, "yes")
    assert not (await runtime.transition_branch(instance.id, branch, yes, "amy")).moved
    # amy leaves and dan joins: 3 assignees still (ben, cy, dan); amy's vote no longer counts.
    directory.groups["board"] = ["ben", "cy", "dan"]
    with pytest.raises(StateWorkflowError, match="not one of its assignees"):
        await runtime.transition_branch(instance.id, branch, yes, "amy")
    first = await runtime.transition_branch(instance.id, branch, yes, "dan")
    assert (first.moved, first.approved_count) == (False, 1)
    second = await runtime.transition_branch(instance.id, branch, yes, "ben")
    assert second.moved and second.approved_count == 2
    dans = await world.rows(app.Vote, app.Vote.approver == "dan")
    assert [(v.status, v.target_node_id) for v in dans] == [("approved", yes)]
    assert uuid.UUID(str(second.instance.id)) == instance.id
