"""Graph moves bound to who acts (functions.requests.graphs over engine.graphs.moves).

Through the request layer, with principals as the app's guard names them:
- a principal naming another user is refused (NotAllowedError, 403) and
  nothing is written, whether it moves, submits or cancels:
  test_a_viewer_may_not_act_as_another_user
- a principal acts as itself when the body names nobody, or names it:
  test_a_principal_acts_as_itself
- an admin acting for a user is checked as that user and recorded as on
  behalf (acted_by, "api-token on behalf of ann"):
  test_an_admin_acting_for_a_user_is_recorded_on_behalf
- the principal's own groups make it an assignee of a group's state; an
  admin acting for that user has only the directory's groups:
  test_a_principals_groups_make_it_an_assignee
Self-approval, on the runtime:
- a template that forbids it refuses the submitter's move and vote
  (SelfApprovalError, 403, SELF_APPROVAL) and offers her no move, while
  another assignee moves: test_a_submitter_may_not_approve_her_own_claim
- a template that does not forbid it lets her: test_self_approval_is_allowed_by_default
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.base.errors import NotAllowedError, SelfApprovalError, StateWorkflowError
from engine.graphs.moves.actors import Actor
from engine.graphs.tables import END, START, STATE
from functions.http.errors import body_of, status_of
from functions.identity.principal import Principal, Role, Via
from functions.requests import graphs
from functions.requests.graphs import CancelRequest, SubmitRequest, TransitionRequest
from tests.apps import graphs as app
from tests.conftest import Database
from tests.graph_helpers import graph_of
from tests.graph_world import World, make_world, node_id, only_branch

MALLORY = Principal(id="mallory", roles=frozenset({Role.VIEWER}), via=Via.API_KEY)
ANN = Principal(id="ann", roles=frozenset({Role.VIEWER}), via=Via.API_KEY)
ADMIN = Principal(id="api-token", roles=frozenset({Role.ADMIN}), via=Via.TOKEN)

# draft -> review (ann, or the finance group) -> approved (cat) -> end
NODES: dict[str, Any] = {
    "start": START,
    "review": {
        "type": STATE,
        "state_code": "review",
        "assignee_users": ["ann", "sam"],
        "assignee_groups": ["finance"],
    },
    "approved": (STATE, "approved", ["cat"]),
    "end": END,
}
EDGES: list[Any] = [
    ("start", "review"),
    ("review", "approved", {"label": "Approve"}),
    ("approved", "end"),
]


@pytest.fixture
async def world(db: Database) -> AsyncIterator[World]:
    async for made in make_world(db, groups={"finance": ["fay"]}):
        yield made


async def started(world: World, *, forbid_self_approval: bool = False) -> tuple[Any, Any]:
    """The graph stored and a claim submitted by sam: the graph and the instance."""
    graph = graph_of(NODES, EDGES, name="claims")
    graph = await world.store(dataclasses.replace(graph, forbid_self_approval=forbid_self_approval))
    claim = await world.claim()
    return graph, await world.runtime.submit(claim, "sam", template_name="claims")


def approve(graph: Any, instance: Any, user: str | None = None) -> TransitionRequest:
    """The body of taking review -> approved, for `user` (None: whoever calls)."""
    return TransitionRequest(
        branch_id=only_branch(instance),
        target_id=node_id(graph, "approved"),
        user=user,
    )


async def test_a_viewer_may_not_act_as_another_user(world: World) -> None:
    graph, instance = await started(world)
    before = await world.runtime.history(instance.id)

    with pytest.raises(NotAllowedError) as refused:
        await graphs.take_transition(
            world.runtime, instance.id, approve(graph, instance, "ann"), MALLORY
        )
    assert str(refused.value) == "mallory may not act as ann."
    assert status_of(refused.value) == 403
    with pytest.raises(NotAllowedError):
        await graphs.cancel_instance(world.runtime, instance.id, CancelRequest(user="ann"), MALLORY)
    with pytest.raises(NotAllowedError):
        await graphs.offered_transitions(world.runtime, instance.id, MALLORY, "ann")
    assert await world.runtime.history(instance.id) == before
    assert (await world.runtime.instance(instance.id)).state_code == "review"

    claim = await world.claim()
    body = SubmitRequest(
        subject_type="claims", subject_key=str(claim.id), user="ann", workflow="claims"
    )
    with pytest.raises(NotAllowedError):
        await graphs.submit_subject(world.runtime, world.Session, body, MALLORY)
    assert len(await world.rows(app.Instance)) == 1

    # Naming nobody, mallory acts as mallory: not an assignee.
    with pytest.raises(StateWorkflowError, match="'mallory' may not move 'review'"):
        await graphs.take_transition(world.runtime, instance.id, approve(graph, instance), MALLORY)
    assert await world.runtime.history(instance.id) == before


async def test_a_principal_acts_as_itself(world: World) -> None:
    graph, instance = await started(world)
    offered = await graphs.offered_transitions(world.runtime, instance.id, ANN)
    assert [choice.display_name for choice in offered] == ["Approve"]

    moved = await graphs.take_transition(world.runtime, instance.id, approve(graph, instance), ANN)
    assert moved["moved"] is True
    votes = [h for h in await world.runtime.history(instance.id) if h.action_type == "approval"]
    assert [(h.actor, h.acted_by, h.to_dict()["done_by"]) for h in votes] == [("ann", None, "ann")]

    # Naming itself is the same as naming nobody.
    again = await world.runtime.submit(await world.claim(), "sam", template_name="claims")
    body = approve(graph, again, "ann")
    assert (await graphs.take_transition(world.runtime, again.id, body, ANN))["moved"] is True
    [vote] = [h for h in await world.runtime.history(again.id) if h.action_type == "approval"]
    assert (vote.actor, vote.acted_by) == ("ann", None)


async def test_an_admin_acting_for_a_user_is_recorded_on_behalf(world: World) -> None:
    graph, instance = await started(world)
    # Acting for a user is acting as that user: cat is no assignee of review.
    with pytest.raises(StateWorkflowError, match="'cat' may not move 'review'"):
        await graphs.take_transition(
            world.runtime, instance.id, approve(graph, instance, "cat"), ADMIN
        )
    offered = await graphs.offered_transitions(world.runtime, instance.id, ADMIN, "ann")
    assert [choice.display_name for choice in offered] == ["Approve"]

    await graphs.take_transition(world.runtime, instance.id, approve(graph, instance, "ann"), ADMIN)
    history = await world.runtime.history(instance.id)
    [vote] = [h for h in history if h.action_type == "approval"]
    assert (vote.actor, vote.acted_by) == ("ann", "api-token")
    assert vote.to_dict()["done_by"] == "api-token on behalf of ann"
    assert vote.to_dict()["acted_by"] == "api-token"
    [cast] = await world.rows(app.Vote, app.Vote.status == "approved")
    assert cast.approver == "ann"

    cancelled = await graphs.cancel_instance(
        world.runtime, instance.id, CancelRequest(user="cat"), ADMIN
    )
    assert cancelled["state_status"] == "cancelled"
    last = (await world.runtime.history(instance.id))[-1]
    assert (last.actor, last.acted_by, last.done_by) == (
        "cat",
        "api-token",
        "api-token on behalf of cat",
    )

    # Submitting on behalf: the user is the submitter, the admin who acted is recorded.
    claim = await world.claim()
    body = SubmitRequest(
        subject_type="claims", subject_key=str(claim.id), user="sam", workflow="claims"
    )
    submitted = await graphs.submit_subject(world.runtime, world.Session, body, ADMIN)
    assert submitted["submitted_by"] == "sam"
    creation = (await world.runtime.history(submitted["id"]))[0]
    assert (creation.action_type, creation.done_by) == ("creation", "api-token on behalf of sam")


async def test_a_principals_groups_make_it_an_assignee(world: World) -> None:
    graph, instance = await started(world)
    zoe = Principal(
        id="zoe", roles=frozenset({Role.VIEWER}), via=Via.OIDC, groups=frozenset({"finance"})
    )
    zed = Principal(
        id="zed", roles=frozenset({Role.VIEWER}), via=Via.OIDC, groups=frozenset({"legal"})
    )
    # The directory's finance group is fay alone; zoe's token says she is in it too.
    assert await graphs.offered_transitions(world.runtime, instance.id, zed) == []
    with pytest.raises(StateWorkflowError):
        await graphs.take_transition(world.runtime, instance.id, approve(graph, instance), zed)
    # An admin acting for zoe has the directory's groups only: zoe is in none.
    assert await graphs.offered_transitions(world.runtime, instance.id, ADMIN, "zoe") == []
    with pytest.raises(StateWorkflowError, match="'zoe' may not move"):
        await graphs.take_transition(
            world.runtime, instance.id, approve(graph, instance, "zoe"), ADMIN
        )

    offered = await graphs.offered_transitions(world.runtime, instance.id, zoe)
    assert [choice.display_name for choice in offered] == ["Approve"]
    moved = await graphs.take_transition(world.runtime, instance.id, approve(graph, instance), zoe)
    assert moved["moved"] is True
    [vote] = [h for h in await world.runtime.history(instance.id) if h.action_type == "approval"]
    assert (vote.actor, vote.acted_by) == ("zoe", None)


async def test_a_submitter_may_not_approve_her_own_claim(world: World) -> None:
    graph, instance = await started(world, forbid_self_approval=True)
    assert instance.submitted_by == "sam"
    before = await world.runtime.history(instance.id)

    assert await world.runtime.transitions_for(instance.id, "sam") == []
    branch, target = only_branch(instance), node_id(graph, "approved")
    with pytest.raises(SelfApprovalError) as refused:
        await world.runtime.transition_branch(instance.id, branch, target, "sam")
    assert "'sam' owns or submitted this instance of 'claims', which forbids self-approval" in str(
        refused.value
    )
    assert (status_of(refused.value), body_of(refused.value)["code"]) == (403, "SELF_APPROVAL")
    # An admin acting for her is refused alike; nothing was written.
    with pytest.raises(SelfApprovalError):
        await world.runtime.transition_branch(
            instance.id, branch, target, Actor("sam", acted_by="api-token")
        )
    assert await world.runtime.history(instance.id) == before
    assert await world.rows(app.Vote, app.Vote.status == "approved") == []

    assert [c.display_name for c in await world.runtime.transitions_for(instance.id, "ann")] == [
        "Approve"
    ]
    moved = await world.runtime.transition_branch(instance.id, branch, target, "ann")
    assert moved.moved and moved.instance.state_code == "approved"


async def test_self_approval_is_allowed_by_default(world: World) -> None:
    graph, instance = await started(world)
    assert [c.display_name for c in await world.runtime.transitions_for(instance.id, "sam")] == [
        "Approve"
    ]
    moved = await world.runtime.transition_branch(
        instance.id, only_branch(instance), node_id(graph, "approved"), "sam"
    )
    assert moved.moved
