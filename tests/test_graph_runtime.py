"""The graph runtime's lifecycle: submit, start, transition, end, cancel, history.

Submit and start:
- a submit starts the START node's target: the instance pinned to the active
  version, CREATION history, branch 1 on the state with its visit, one pending
  vote per effective assignee, ASSIGNMENT history and a `state_assignment`
  event, and the subject's state column set:
  test_submit_starts_the_first_state
- a subject with an active instance is refused: test_a_subject_with_an_active_instance_is_refused
- ... even by a submit racing an uncommitted one (it waits on the partial
  unique index, then is refused): test_a_submit_racing_another_is_refused_by_the_index
- the active version of the name is resolved at submit time, and a name with
  none is NotFoundError: test_submit_uses_the_active_version_and_refuses_a_name_without_one
- an id starts only the active version: an inactive version's id (or the
  active id under another name) is TemplateNotActiveError (409) and writes
  nothing: test_submit_by_id_takes_only_the_active_version
- START missing or without its one edge, or leading to a state without
  assignees, a condition without a registered predicate, or anything else, is
  refused and writes nothing: test_a_broken_start_is_refused
- a condition at START routes at once: test_a_condition_at_start_routes_at_once
- submit joins the caller's transaction: nothing if it rolls back, its
  refusal leaves the transaction usable: test_submit_joins_the_callers_transaction

Transitions:
- a move completes the visit, closes the other pending votes, writes
  APPROVAL and STATUS_CHANGE, and enters the target:
  test_a_move_completes_the_visit_and_enters_the_target
- ... the other pending votes of users named on the state too, and a sole
  assignee's move leaves none pending:
  test_a_move_closes_the_pending_votes_of_the_other_named_users
- refused: a finished instance (409), a branch of another instance or no
  longer active, no edge, a person not assigned, an empty comment where one
  is required, an escalation edge, a branch that moved on from the state the
  user saw: test_a_completed_instance_refuses_transitions,
  test_a_branch_not_of_the_instance_is_refused, test_refused_transitions_write_nothing,
  test_graph_forks.test_the_forked_parent_cannot_move
- the transitions a person may take now, per branch, in order:
  test_transitions_for_lists_what_a_person_may_take_now
- re-entering a state counts its iteration: test_reentering_a_state_counts_its_iterations
- the subject's state follows every step: test_the_subject_state_follows_each_step
- an END finalizes: completed, approved, COMPLETION history, a
  `state_completion` event to the originator: test_an_end_finalizes_the_instance
- the subject ends in the END's own state code when it names one, else in the
  last business state: test_an_end_with_a_state_code_names_the_final_state
- a state whose groups expand to nobody warns:
  test_a_state_whose_groups_expand_to_nobody_warns
- version pinning: an in-flight instance keeps its version after another is
  activated directly in the table: test_an_in_flight_instance_keeps_its_version

Cancel and history:
- cancel ends every branch, rejects their visits, clears the subject's state:
  test_cancel_ends_the_branches_and_clears_the_subject
- a finished instance cannot be cancelled: test_cancel_of_a_finished_instance_is_refused
- history: its action types and metadata keys, in order, and only ever
  inserted: test_history_keeps_its_types_and_keys_in_order

Notifications:
- through a DatabaseEventRegistry, in the transaction; ids derived from the
  visit: test_notifications_are_events_with_ids_from_the_visit
- a rolled-back transaction notifies nobody: test_a_rolled_back_submit_notifies_nobody
- an in-memory registry is told after the commit:
  test_an_in_memory_registry_is_told_after_the_commit

Speed that must not regress quietly:
- reads between moves leave the moves' statements prepared on a shared
  connection (psycopg forgets them on a ROLLBACK; reads end in COMMIT):
  test_reads_between_moves_keep_the_moves_prepared
- ... and the generic plan they settle on, made on small tables' statistics,
  finds the rows the write changes through their indexes, never a read of a
  whole table: test_a_moves_generic_plan_finds_its_rows_through_the_indexes

A move's transaction and its connection:
- a refused move's transaction is rolled back before its connection goes back
  to the pool: test_a_refused_move_leaves_its_connection_out_of_any_transaction
- a move on a lost connection fails as a lost connection, and the next one moves:
  test_a_move_whose_connection_was_lost_fails_and_the_next_one_moves
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from sqlalchemy import insert, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import OperationalError

from engine import (
    DatabaseEventRegistry,
    InMemoryEventRegistry,
    WorkflowEvent,
    connect_workflows,
)
from engine.base.errors import (
    NotFoundError,
    StateWorkflowError,
    TemplateNotActiveError,
    WorkflowAlreadyCompletedError,
    WorkflowSubmissionError,
)
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.write_statement import write_statement
from engine.graphs.moves.writes import Shape
from engine.graphs.tables import (
    CONDITION,
    END,
    START,
    STATE,
)
from engine.model.connection import session_engine
from functions.http.errors import status_of
from tests.apps import graphs as app, outbox as outbox_app
from tests.conftest import Database
from tests.graph_helpers import graph_of
from tests.graph_world import (
    LINEAR_EDGES,
    LINEAR_NODES,
    TABLES,
    World,
    make_world,
    node_id,
    one_connection,
    only_branch,
    submitted,
    until_a_lock_is_awaited,
)


# A plain approval: draft -> review (ann) -> approved (end), with a way back.
@pytest.fixture
async def world(db: Database) -> AsyncIterator[World]:
    async for made in make_world(db, groups={"finance": ["fay", "fred"]}):
        yield made


# -- submit and start ------------------------------------------------------------------------


async def test_submit_starts_the_first_state(world: World) -> None:
    nodes = {**LINEAR_NODES, "review": {"type": STATE, "state_code": "review",
             "assignee_users": ["ann"], "assignee_groups": ["finance"]}}  # fmt: skip
    graph, claim, instance = await submitted(world, nodes)
    review = node_id(graph, "review")
    assert (instance.template_id, instance.state_status, instance.status) == (
        graph.template_id,
        "active",
        "in_review",
    )
    assert (instance.current_node_id, instance.state_code) == (review, "review")
    assert [(b.number, b.node_id, b.status) for b in instance.branches] == [(1, review, "active")]
    assert instance.submitted_at is not None and instance.branches[0].started_at is not None
    [visit] = await world.rows(app.Visit, app.Visit.instance_id == instance.id)
    assert (visit.node_id, visit.iteration, visit.is_current, visit.status) == (
        review,
        1,
        True,
        "pending",
    )
    votes = await world.rows(app.Vote, app.Vote.visit_id == visit.id)
    assert sorted(v.approver for v in votes) == ["ann", "fay", "fred"]
    assert {(v.status, v.is_available) for v in votes} == {("pending", True)}
    history = await world.runtime.history(instance.id)
    assert [h.action_type for h in history] == ["creation", "assignment"]
    assert history[1].message == "Workflow started in state 'review'."
    assert history[1].metadata["assignees"] == ["ann", "fay", "fred"]
    [event] = await world.events("duly.graph.state_assignment")
    assert event.payload["assignees"] == ["ann", "fay", "fred"]
    assert await world.subject_state(claim) == "review"
    assert claim.workflow_state == "review"  # the row in hand shows it too


async def test_a_subject_with_an_active_instance_is_refused(world: World) -> None:
    _, claim, first = await submitted(world)
    with pytest.raises(WorkflowSubmissionError):
        await world.runtime.submit(claim, "sam", template_name="claims")
    assert len(await world.rows(app.Instance)) == 1
    await world.runtime.cancel(first.id, "sam")
    again = await world.runtime.submit(claim, "sam", template_name="claims")
    assert again.id != first.id and again.is_active


async def test_a_submit_racing_another_is_refused_by_the_index(world: World) -> None:
    graph = await world.store(graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"))
    claim = await world.claim()
    # Another transaction has inserted an active instance of the claim, not yet committed.
    other = session_engine(world.Session)
    async with other.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(
            insert(app.Instance).values(
                id=uuid.uuid4(),
                template_id=graph.template_id,
                subject_type="claims",
                subject_key=str(claim.id),
            )
        )
        submit = asyncio.create_task(world.runtime.submit(claim, "sam", template_name="claims"))
        await until_a_lock_is_awaited(world)  # the submit waits on the index entry
        assert not submit.done()
        await transaction.commit()
    with pytest.raises(WorkflowSubmissionError):
        await submit
    assert len(await world.rows(app.Instance)) == 1
    assert await world.rows(app.History) == []


async def test_submit_uses_the_active_version_and_refuses_a_name_without_one(
    world: World,
) -> None:
    first = await world.store(graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"), active=False)
    second = await world.store(
        graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims", version=2), active=True
    )
    claim = await world.claim()
    instance = await world.runtime.submit(claim, "sam", template_name="claims")
    assert instance.template_id == second.template_id != first.template_id
    assert instance.version == 2
    with pytest.raises(NotFoundError):
        await world.runtime.submit(await world.claim(), "sam", template_name="nothing")


async def test_submit_by_id_takes_only_the_active_version(world: World) -> None:
    first = await world.store(graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"), active=False)
    second = await world.store(
        graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims", version=2), active=True
    )
    claim = await world.claim()
    for template_id, name in [(first.template_id, None), (second.template_id, "other")]:
        with pytest.raises(TemplateNotActiveError) as refused:
            await world.runtime.submit(claim, "sam", template_id=template_id, template_name=name)
        assert (refused.value.code, status_of(refused.value)) == ("TEMPLATE_NOT_ACTIVE", 409)
    assert (await world.rows(app.Instance), await world.rows(app.History)) == ([], [])
    assert await world.subject_state(claim) is None
    started = await world.runtime.submit(claim, "sam", template_id=second.template_id)
    assert started.version == 2


@pytest.mark.parametrize(
    ("nodes", "edges"),
    [
        ({"review": (STATE, "review", ["ann"])}, []),
        ({"start": START, "review": (STATE, "review", ["ann"])}, []),
        ({"start": START, "review": (STATE, "review", [])}, [("start", "review")]),
        (
            {"start": START, "check": {"type": CONDITION, "condition": "unknown"}, "end": END},
            [("start", "check"), ("check", "end", {"condition_result": "true"})],
        ),
        ({"start": START, "end": END}, [("start", "end")]),
    ],
    ids=["no-start", "no-edge", "no-assignees", "no-predicate", "not-a-state"],
)
async def test_a_broken_start_is_refused(world: World, nodes: Any, edges: Any) -> None:
    await world.store(graph_of(nodes, edges, name="broken"))
    claim = await world.claim()
    with pytest.raises(StateWorkflowError):
        await world.runtime.submit(claim, "sam", template_name="broken")
    assert await world.rows(app.Instance) == []
    assert await world.subject_state(claim) is None


async def test_a_condition_at_start_routes_at_once(db: Database) -> None:
    conditions = ConditionRegistry()
    conditions.register("large", lambda claim, instance: claim.amount > 1000)
    async for world in make_world(db, conditions=conditions):
        nodes = {
            "start": START,
            "check": {"type": CONDITION, "condition": "large"},
            "board": (STATE, "board", ["bea"]),
            "manager": (STATE, "manager", ["max"]),
            "end": END,
        }
        edges = [
            ("start", "check"),
            ("check", "board", {"condition_result": "true"}),
            ("check", "manager", {"condition_result": "false"}),
            ("board", "end"),
            ("manager", "end"),
        ]
        graph = await world.store(graph_of(nodes, edges, name="route"))
        small = await world.runtime.submit(await world.claim("10"), "sam", template_name="route")
        large = await world.runtime.submit(await world.claim("5000"), "sam", template_name="route")
        assert small.current_node_id == node_id(graph, "manager")
        assert large.current_node_id == node_id(graph, "board")
        assert large.state_code == "board"
        entries = await world.runtime.history(large.id)
        assert [e.action_type for e in entries] == ["creation", "status_change", "assignment"]
        assert entries[1].metadata["condition"] == "large"
        assert entries[1].metadata["result"] is True


async def test_submit_joins_the_callers_transaction(world: World) -> None:
    await world.store(graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"))
    async with world.Session() as session:
        claim = app.Claim(title="in a transaction", amount=Decimal(5))
        session.add(claim)
        await session.flush()
        instance = await world.runtime.submit(claim, "sam", template_name="claims", session=session)
        assert instance.state_code == "review"
        await session.rollback()
    assert await world.rows(app.Instance) == []
    assert await world.rows(app.Claim) == []
    assert await world.events() == []
    async with world.Session() as session:
        claim = app.Claim(title="committed", amount=Decimal(5))
        session.add(claim)
        await session.flush()
        await world.runtime.submit(claim, "sam", template_name="claims", session=session)
        with pytest.raises(WorkflowSubmissionError):
            await world.runtime.submit(claim, "sam", template_name="claims", session=session)
        claim.title = "still usable"  # the refusal rolled back to its savepoint only
        await session.commit()
    [instance_row] = await world.rows(app.Instance)
    assert instance_row.subject_key == str(claim.id)
    assert await world.subject_state(claim) == "review"
    assert len(await world.events("duly.graph.state_assignment")) == 1


# -- transitions ---------------------------------------------------------------------------


async def test_a_move_completes_the_visit_and_enters_the_target(db: Database) -> None:
    async for world in make_world(db, groups={"reviewers": ["ann", "abe"]}):
        nodes = {
            **LINEAR_NODES,
            "review": {"type": STATE, "state_code": "review", "assignee_groups": ["reviewers"]},
        }
        graph, claim, instance = await submitted(world, nodes)
        branch = only_branch(instance)
        outcome = await world.runtime.transition_branch(
            instance.id, branch, node_id(graph, "approved"), "abe", "looks right"
        )
        assert outcome.moved and (outcome.approved_count, outcome.required_approvals) == (1, 1)
        assert outcome.instance.current_node_id == node_id(graph, "approved")
        assert outcome.instance.branches[0].id == branch  # a move keeps the branch
        first, second = await world.rows(
            app.Visit, app.Visit.instance_id == instance.id, order=app.Visit.entered_at
        )
        if first.node_id != node_id(graph, "review"):
            first, second = second, first
        assert (first.status, first.is_current, first.completed_at is not None) == (
            "approved",
            False,
            True,
        )
        assert (second.node_id, second.is_current) == (node_id(graph, "approved"), True)
        votes = {v.approver: v for v in await world.rows(app.Vote, app.Vote.visit_id == first.id)}
        assert (votes["abe"].status, votes["abe"].target_node_id, votes["abe"].comment) == (
            "approved",
            node_id(graph, "approved"),
            "looks right",
        )
        assert (votes["ann"].status, votes["ann"].is_available) == ("pending", False)
        assert [v.approver for v in await world.rows(app.Vote, app.Vote.visit_id == second.id)] == [
            "cat"
        ]
        history = await world.runtime.history(instance.id)
        assert [h.action_type for h in history] == [
            "creation",
            "assignment",
            "approval",
            "status_change",
            "assignment",
        ]
        move = history[3]
        assert (move.actor, move.metadata["from_state"], move.metadata["to_state"]) == (
            "abe",
            "review",
            "approved",
        )
        assert move.metadata["comment"] == "looks right"
        assert move.metadata["threshold"] == "single"
        assert await world.subject_state(claim) == "approved"


async def test_a_move_closes_the_pending_votes_of_the_other_named_users(world: World) -> None:
    """Users named on the state, not only groups, have their pending votes closed by
    another's move; a state whose only user moved it has no vote left pending."""
    nodes = {
        **LINEAR_NODES,
        "review": {"type": STATE, "state_code": "review", "assignee_users": ["ann", "abe"]},
    }
    graph, _, instance = await submitted(world, nodes)
    branch = only_branch(instance)
    await world.runtime.transition_branch(instance.id, branch, node_id(graph, "approved"), "abe")
    await world.runtime.transition_branch(instance.id, branch, node_id(graph, "end"), "cat")
    votes = {
        (v.approver, v.status, v.is_available)
        for v in await world.rows(app.Vote, app.Vote.instance_id == instance.id)
    }
    assert votes == {
        ("abe", "approved", True),
        ("ann", "pending", False),
        ("cat", "approved", True),
    }


async def test_a_completed_instance_refuses_transitions(world: World) -> None:
    graph, _, instance = await submitted(world)
    branch = only_branch(instance)
    await world.runtime.cancel(instance.id, "sam")
    with pytest.raises(WorkflowAlreadyCompletedError) as refused:
        await world.runtime.transition_branch(
            instance.id, branch, node_id(graph, "approved"), "ann"
        )
    assert (refused.value.code, status_of(refused.value)) == ("WORKFLOW_COMPLETED", 409)
    with pytest.raises(NotFoundError):
        await world.runtime.transition_branch(
            uuid.uuid4(), branch, node_id(graph, "approved"), "ann"
        )


async def test_a_branch_not_of_the_instance_is_refused(world: World) -> None:
    graph, _, instance = await submitted(world)
    other = await world.runtime.submit(await world.claim(), "sam", template_name="claims")
    with pytest.raises(StateWorkflowError, match="not a branch of instance") as refused:
        await world.runtime.transition_branch(
            instance.id, only_branch(other), node_id(graph, "approved"), "ann"
        )
    assert (refused.value.code, status_of(refused.value)) == ("STATE_WORKFLOW_ERROR", 400)
    with pytest.raises(StateWorkflowError, match="not a branch of instance"):
        await world.runtime.transition_branch(
            instance.id, uuid.uuid4(), node_id(graph, "approved"), "ann"
        )


async def test_refused_transitions_write_nothing(world: World) -> None:
    graph, _, instance = await submitted(world)
    escalating = graph_of(
        {
            "start": START,
            "review": {"type": STATE, "state_code": "review", "assignee_users": ["ann"]},
            "late": (STATE, "late", ["boss"]),
        },
        [("start", "review"), ("review", "late", {"escalation": True})],
        name="escalating",
    )
    await world.store(escalating)
    late = await world.runtime.submit(await world.claim(), "sam", template_name="escalating")
    branch = only_branch(instance)
    before = await world.runtime.history(instance.id)
    refusals: list[tuple[Any, ...]] = [
        (instance.id, branch, node_id(graph, "end"), "ann", "", "No transition leads"),
        (instance.id, branch, uuid.uuid4(), "ann", "", "No transition leads"),
        (instance.id, branch, node_id(graph, "approved"), "bob", "", "not one of its assignees"),
        (instance.id, branch, node_id(graph, "rework"), "ann", "  ", "requires a comment"),
    ]
    for instance_id, branch_id, target, user, comment, message in refusals:
        with pytest.raises(StateWorkflowError, match=message):
            await world.runtime.transition_branch(instance_id, branch_id, target, user, comment)
    with pytest.raises(StateWorkflowError, match="escalation"):
        await world.runtime.transition_branch(
            late.id, only_branch(late), node_id(escalating, "late"), "ann"
        )
    with pytest.raises(StateWorkflowError, match="no longer on 'approved'"):
        await world.runtime.transition_branch(
            instance.id,
            branch,
            node_id(graph, "end"),
            "cat",
            source_node_id=node_id(graph, "approved"),
        )
    assert await world.runtime.history(instance.id) == before
    assert len(await world.rows(app.Vote, app.Vote.status == "approved")) == 0


async def test_transitions_for_lists_what_a_person_may_take_now(world: World) -> None:
    graph, _, instance = await submitted(world)
    choices = await world.runtime.transitions_for(instance.id, "ann")
    assert [(c.display_name, c.target_id, c.comment_required) for c in choices] == [
        ("Approve", node_id(graph, "approved"), False),
        ("Send back", node_id(graph, "rework"), True),
    ]
    assert {c.branch_id for c in choices} == {only_branch(instance)}
    assert await world.runtime.transitions_for(instance.id, "bob") == []
    assert choices[0].to_dict()["target_id"] == str(node_id(graph, "approved"))


async def test_reentering_a_state_counts_its_iterations(world: World) -> None:
    graph, _, instance = await submitted(world)
    branch = only_branch(instance)
    review, rework = node_id(graph, "review"), node_id(graph, "rework")
    for _ in range(2):
        await world.runtime.transition_branch(instance.id, branch, rework, "ann", "again")
        await world.runtime.transition_branch(instance.id, branch, review, "bob")
    visits = await world.rows(app.Visit, app.Visit.node_id == review, order=app.Visit.iteration)
    assert [(v.iteration, v.is_current) for v in visits] == [(1, False), (2, False), (3, True)]
    reworks = await world.rows(app.Visit, app.Visit.node_id == rework, order=app.Visit.iteration)
    assert [v.iteration for v in reworks] == [1, 2]
    # Each entry is its own notification.
    assert len(await world.events("duly.graph.state_assignment")) == 5


async def test_the_subject_state_follows_each_step(world: World) -> None:
    graph, claim, instance = await submitted(world)
    branch = only_branch(instance)
    seen = [await world.subject_state(claim)]
    for target, user, comment in [
        ("rework", "ann", "fix it"),
        ("review", "bob", ""),
        ("approved", "ann", ""),
        ("end", "cat", ""),
    ]:
        outcome = await world.runtime.transition_branch(
            instance.id, branch, node_id(graph, target), user, comment
        )
        seen.append(await world.subject_state(claim))
        assert outcome.instance.state_code == seen[-1]
    assert seen == ["review", "rework", "review", "approved", "approved"]


async def test_an_end_finalizes_the_instance(world: World) -> None:
    graph, claim, instance = await submitted(world)
    branch = only_branch(instance)
    await world.runtime.transition_branch(instance.id, branch, node_id(graph, "approved"), "ann")
    outcome = await world.runtime.transition_branch(
        instance.id, branch, node_id(graph, "end"), "cat"
    )
    done = outcome.instance
    assert (done.state_status, done.status, done.is_active, done.is_completed) == (
        "completed",
        "approved",
        False,
        True,
    )
    assert done.completed_at is not None and done.current_node_id is None
    assert done.branches == () and done.state_code == "approved"
    assert (await world.runtime.instance(instance.id)) == done
    [row] = await world.rows(app.Branch)
    assert (row.status, row.current_node_id) == ("completed", node_id(graph, "end"))
    assert (await world.actions(instance.id))[-1] == "completion"
    [event] = await world.events("duly.graph.state_completion")
    assert event.payload["recipients"] == ["sam"] and event.payload["state_code"] == "approved"
    assert await world.subject_state(claim) == "approved"


async def test_an_end_with_a_state_code_names_the_final_state(world: World) -> None:
    nodes = {**LINEAR_NODES, "end": {"type": END, "state_code": "paid"}}
    graph, claim, instance = await submitted(world, nodes)
    branch = only_branch(instance)
    await world.runtime.transition_branch(instance.id, branch, node_id(graph, "approved"), "ann")
    done = await world.runtime.transition_branch(instance.id, branch, node_id(graph, "end"), "cat")
    assert (done.instance.state_status, done.instance.state_code) == ("completed", "paid")
    assert await world.subject_state(claim) == "paid"


async def test_a_state_whose_groups_expand_to_nobody_warns(world: World) -> None:
    nodes = {**LINEAR_NODES, "approved": {"type": STATE, "state_code": "approved",
             "assignee_groups": ["empty"]}}  # fmt: skip
    graph, _, instance = await submitted(world, nodes)
    await world.runtime.transition_branch(
        instance.id, only_branch(instance), node_id(graph, "approved"), "ann"
    )
    last = (await world.runtime.history(instance.id))[-1]
    assert (last.action_type, last.metadata["warning"]) == (
        "status_change",
        "no_effective_assignees",
    )
    assert len(await world.events("duly.graph.state_assignment")) == 1  # nobody to tell


async def test_an_in_flight_instance_keeps_its_version(world: World) -> None:
    first, claim, instance = await submitted(world)
    # Version 2 sends review straight to the end; it is activated directly in the table.
    second = await world.store(
        graph_of(
            {"start": START, "review": (STATE, "review", ["ann"]), "end": END},
            [("start", "review"), ("review", "end")],
            name="claims",
            version=2,
        ),
        active=False,
    )
    templates = app.Template.__table__
    async with session_engine(world.Session).begin() as conn:
        await conn.execute(update(templates).values(is_active=templates.c.id == second.template_id))
    branch = only_branch(instance)
    with pytest.raises(StateWorkflowError):
        await world.runtime.transition_branch(instance.id, branch, node_id(second, "end"), "ann")
    moved = await world.runtime.transition_branch(
        instance.id, branch, node_id(first, "approved"), "ann"
    )
    assert moved.instance.template_id == first.template_id and moved.instance.version == 1
    fresh = await world.runtime.submit(await world.claim(), "sam", template_name="claims")
    assert fresh.template_id == second.template_id
    assert await world.subject_state(claim) == "approved"


# -- cancel and history --------------------------------------------------------------------


async def test_cancel_ends_the_branches_and_clears_the_subject(world: World) -> None:
    _, claim, instance = await submitted(world)
    cancelled = await world.runtime.cancel(instance.id, "sam", "withdrawn")
    assert (cancelled.state_status, cancelled.status) == ("cancelled", "rejected")
    assert (cancelled.is_active, cancelled.is_completed, cancelled.branches) == (False, True, ())
    [branch] = await world.rows(app.Branch)
    assert branch.status == "cancelled" and branch.completed_at is not None
    [visit] = await world.rows(app.Visit)
    assert (visit.status, visit.is_current) == ("rejected", False)
    assert {v.is_available for v in await world.rows(app.Vote)} == {False}
    last = (await world.runtime.history(instance.id))[-1]
    assert (last.action_type, last.actor, last.metadata["comment"]) == (
        "status_change",
        "sam",
        "withdrawn",
    )
    assert await world.subject_state(claim) is None


async def test_cancel_of_a_finished_instance_is_refused(world: World) -> None:
    _, _, instance = await submitted(world)
    await world.runtime.cancel(instance.id)
    with pytest.raises(WorkflowAlreadyCompletedError):
        await world.runtime.cancel(instance.id)
    with pytest.raises(NotFoundError):
        await world.runtime.cancel(uuid.uuid4())


async def test_history_keeps_its_types_and_keys_in_order(world: World) -> None:
    graph, _, instance = await submitted(world)
    branch = only_branch(instance)
    await world.runtime.transition_branch(
        instance.id, branch, node_id(graph, "rework"), "ann", "redo"
    )
    entries = await world.runtime.history(instance.id)
    assert [e.id for e in entries] == sorted(e.id for e in entries)
    move = next(e for e in entries if e.action_type == "status_change")
    assert {
        "state_code",
        "from_state",
        "to_state",
        "to_state_type",
        "branch_id",
        "comment",
        "target_state_id",
        "approved_count",
        "required_approvals",
        "threshold",
    } <= set(move.metadata)
    assert move.metadata["target_state_id"] == str(node_id(graph, "rework"))
    assert move.to_dict()["metadata"] == move.metadata
    with pytest.raises(NotFoundError):
        await world.runtime.history(uuid.uuid4())
    # Rows are only ever inserted: the one statement that writes them, with every part it
    # can have, inserts into the history table and changes it no other way.
    everything = Shape(*([True] * 10), app.Claim, True, True)
    written = str(write_statement(TABLES, everything).compile(dialect=postgresql.dialect()))
    assert "INSERT INTO duly_graph_history" in written
    assert "UPDATE duly_graph_history" not in written
    assert "DELETE FROM duly_graph_history" not in written


# -- notifications -------------------------------------------------------------------------


async def test_notifications_are_events_with_ids_from_the_visit(world: World) -> None:
    nodes = {**LINEAR_NODES, "approved": {"type": STATE, "state_code": "approved",
             "assignee_users": ["cat"], "assignment_template": "approved-mail",
             "notify_originator": True}}  # fmt: skip
    graph, claim, instance = await submitted(world, nodes)
    await world.runtime.transition_branch(
        instance.id, only_branch(instance), node_id(graph, "approved"), "ann"
    )
    visit = (await world.rows(app.Visit, app.Visit.node_id == node_id(graph, "approved")))[0]
    events = await world.events("duly.graph.state_assignment")
    assert len(events) == 2
    event = next(e for e in events if e.payload["visit_id"] == str(visit.id))
    assert event.event_id == str(uuid.uuid5(visit.id, "duly.graph.state_assignment"))
    assert event.event_name == "state_assignment"
    assert event.payload == {
        "instance_id": str(instance.id),
        "template_id": str(graph.template_id),
        "workflow": "claims",
        "version": 1,
        "subject_type": "claims",
        "subject_key": str(claim.id),
        "originator": "sam",
        "state_code": "approved",
        "node_id": str(visit.node_id),
        "node_name": "approved",
        "branch_id": str(only_branch(instance)),
        "visit_id": str(visit.id),
        "assignees": ["cat"],
        "assignment_template": "approved-mail",
        "notify_originator": True,
    }
    outbox = await world.rows(outbox_app.Outbox)
    assert {row.event_id for row in outbox} == {e.event_id for e in events}


async def test_a_rolled_back_submit_notifies_nobody(world: World) -> None:
    await world.store(graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"))
    claim = await world.claim()
    async with world.Session() as session:
        await world.runtime.submit(claim, "sam", template_name="claims", session=session)
        assert len(await world.events()) == 0  # not committed: nobody else sees it
        await session.rollback()
    assert await world.rows(outbox_app.Outbox) == []
    assert await world.subject_state(claim) is None


async def test_an_in_memory_registry_is_told_after_the_commit(world: World) -> None:
    graph = await world.store(graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"))
    registry = InMemoryEventRegistry()
    seen: list[tuple[str, int]] = []

    async def count_instances(event: WorkflowEvent) -> None:
        # Runs after the commit: another connection sees the instance.
        seen.append((event.event_name, len(await world.rows(app.Instance))))

    registry.register("state_assignment", count_instances)
    registry.register("state_completion", count_instances)
    runtime = GraphRuntime(TABLES, events=registry)
    instance = await runtime.submit(await world.claim(), "sam", template_name="claims")
    await runtime.transition_branch(
        instance.id, only_branch(instance), node_id(graph, "approved"), "ann"
    )
    await runtime.transition_branch(
        instance.id, only_branch(instance), node_id(graph, "end"), "cat"
    )
    assert seen == [("state_assignment", 1), ("state_assignment", 1), ("state_completion", 1)]
    assert await world.events() == []
    async with world.Session() as session:
        claim = app.Claim(title="joined", amount=Decimal(1))
        session.add(claim)
        await session.flush()
        await runtime.submit(claim, "sam", template_name="claims", session=session)
        await asyncio.sleep(0.05)
        assert len(seen) == 3  # not before the caller commits
        await session.commit()
    await asyncio.sleep(0.05)
    assert seen[-1] == ("state_assignment", 2)


# -- prepared statements -----------------------------------------------------------------------


async def test_reads_between_moves_keep_the_moves_prepared(db: Database) -> None:
    """A read ends in COMMIT, not the pool's ROLLBACK, on which psycopg forgets its prepared
    statements: a move's statements stay prepared on a connection that also serves reads."""
    async with one_connection(db) as one:
        engine, runtime = one.engine, one.runtime
        graph, instance, branch = one.graph, one.instance, one.branch
        review, rework = node_id(graph, "review"), node_id(graph, "rework")
        for _ in range(4):  # psycopg prepares a statement from its sixth use on
            await runtime.transition_branch(instance.id, branch, rework, "ann", "again")
            assert await runtime.transitions_for(instance.id, "bob")
            await runtime.transition_branch(instance.id, branch, review, "bob")
            await runtime.instance(instance.id)
            await runtime.history(instance.id)
        async with engine.connect() as conn:
            prepared = (
                (await conn.execute(text("SELECT statement FROM pg_prepared_statements")))
                .scalars()
                .all()
            )
            await conn.commit()
    await engine.dispose()
    assert any(statement.startswith("WITH move AS") for statement in prepared), prepared
    assert any("FOR NO KEY UPDATE" in statement for statement in prepared), prepared


async def test_a_moves_generic_plan_finds_its_rows_through_the_indexes(db: Database) -> None:
    """Prepared, a move's write runs a generic plan, made once on the statistics of the
    moment: planned on a small votes table, the keys of the votes it closes sent as an
    array (ten keys, for all the planner knew) read the whole table instead of probing its
    index, a scan then growing with every vote. Nothing references the votes table, so its
    sequential scans are the write's own."""
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    generic = {"options": "-c plan_cache_mode=force_generic_plan"}
    engine = db.engine(pool_size=1, max_overflow=0, connect_args=generic)
    runtime = GraphRuntime(TABLES, engine=engine)
    pair = {"type": STATE, "state_code": "rework", "assignee_users": ["bob", "bea"]}
    async with connect_workflows(Session):
        world = World(Session, runtime, DatabaseEventRegistry(), ConditionRegistry())
        graph, _, instance = await submitted(world, {**LINEAR_NODES, "rework": pair})
        branch = only_branch(instance)
        review, rework = node_id(graph, "review"), node_id(graph, "rework")
        async with session_engine(Session).begin() as conn:
            # A votes table of some hundreds of rows, pending as votes are while states
            # wait, analyzed (as a bench's, or a young deployment's): the plans' statistics.
            await conn.execute(
                text(
                    "INSERT INTO duly_graph_visits (id, instance_id, branch_id, node_id, status, "
                    "is_current, iteration, entered_at) SELECT gen_random_uuid(), instance_id, "
                    "branch_id, node_id, 'approved', false, 0, now() FROM duly_graph_visits, "
                    "generate_series(1, 150)"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO duly_graph_votes (id, visit_id, instance_id, approver, status, "
                    "is_available, comment) SELECT gen_random_uuid(), v.id, v.instance_id, a, "
                    "'pending', true, '' FROM duly_graph_visits v, "
                    "unnest(ARRAY['ann', 'bob']) AS a WHERE NOT v.is_current"
                )
            )
            await conn.execute(text("ANALYZE"))
        before = await sequential_scans(engine, "duly_graph_votes")
        for _ in range(5):  # each write planned generic, as a prepared one settles on
            await runtime.transition_branch(instance.id, branch, rework, "ann", "again")
            await runtime.transition_branch(instance.id, branch, review, "bob")
        after = await sequential_scans(engine, "duly_graph_votes")
    assert after == before


async def sequential_scans(engine: Any, table: str) -> int:
    """Sequential scans of `table` so far, with the counts of `engine`'s connection flushed."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_stat_force_next_flush()"))
        await conn.commit()
    async with engine.connect() as conn:
        query = text("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = :table")
        count = (await conn.execute(query, {"table": table})).scalar_one()
        await conn.commit()
    return int(count)


async def test_a_refused_move_leaves_its_connection_out_of_any_transaction(
    db: Database,
) -> None:
    """A refused move's transaction is rolled back before its connection goes back to the
    pool, and a move that commits leaves it idle too."""
    async with one_connection(db) as one:
        engine, runtime = one.engine, one.runtime
        graph, instance, branch = one.graph, one.instance, one.branch
        with pytest.raises(StateWorkflowError):
            await runtime.transition_branch(instance.id, branch, node_id(graph, "approved"), "bob")
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        outcome = await runtime.transition_branch(
            instance.id, branch, node_id(graph, "approved"), "ann"
        )
        assert outcome.moved
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_a_move_whose_connection_was_lost_fails_and_the_next_one_moves(
    db: Database,
) -> None:
    """A move on a connection the server dropped fails as SQLAlchemy reports a lost
    connection, and the next move goes through on a fresh one (none is reused broken)."""
    async with one_connection(db) as one:
        engine, runtime = one.engine, one.runtime
        graph, instance, branch = one.graph, one.instance, one.branch
        async with engine.connect() as conn:
            pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        db.sql("SELECT pg_terminate_backend(%s)", pid)
        with pytest.raises(OperationalError):
            await runtime.transition_branch(instance.id, branch, node_id(graph, "approved"), "ann")
        outcome = await runtime.transition_branch(
            instance.id, branch, node_id(graph, "approved"), "ann"
        )
        assert outcome.moved
