"""Approval deadlines and escalation, run by the engine's own timers.

- a state with a deadline gives its visit `deadline_at` (the database clock
  plus the deadline) and a timer row due at that instant, which `next_due`
  counts: test_a_deadline_is_a_timer_due_at_the_visits_deadline
- a worker's on_idle is told the deadline: test_a_workers_on_idle_sees_the_deadline
- nothing runs before the deadline; after it, the engine's drain takes the
  timer and moves the branch along the escalation edge as the system (no
  actor, no vote, STATUS_CHANGE with escalated), the visit completed and its
  pending votes closed, and the timer row is finished by the engine, not
  cancelled: test_an_expired_deadline_escalates_along_the_escalation_edge
- a transition before the deadline cancels the timer in its transaction:
  test_a_transition_before_the_deadline_cancels_the_timer
- an escalation does nothing if the state was left meanwhile, or when run
  again after it succeeded: test_an_escalation_does_nothing_if_the_state_was_left
- an escalation into a state with a deadline arms that state's timer:
  test_an_escalation_chain_arms_each_timer
- a state with a deadline but no escalation edge stays where it is:
  test_a_deadline_without_an_escalation_edge_leaves_the_state
- cancel cancels the instance's timers: test_cancel_cancels_the_timers
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from engine import run_workflows
from engine.claims.next_due import next_due
from engine.graphs.design.model import Graph
from engine.graphs.moves.snapshots import InstanceSnapshot
from engine.model.connection import session_engine
from engine.model.registry import workflow_info
from engine.testing import drain, move_clock
from tests.apps import graphs as app
from tests.conftest import Database
from tests.graph_helpers import DEADLINE, escalating
from tests.graph_world import World, make_world, node_id, only_branch


@pytest.fixture
async def world(db: Database) -> AsyncIterator[World]:
    async for made in make_world(db):
        yield made


async def started(world: World, graph: Graph | None = None) -> tuple[Graph, InstanceSnapshot]:
    stored = await world.store(graph or escalating())
    instance = await world.runtime.submit(await world.claim(), "sam", template_name="escalating")
    return stored, instance


async def timers(world: World) -> list[app.Timer]:
    return await world.rows(app.Timer, order=app.Timer.wake_at)


async def next_instant(world: World) -> datetime | None:
    async with session_engine(world.Session).connect() as conn:
        found = await next_due(conn, [workflow_info(app.Timer)])
    return None if found is None else found.at


async def test_a_deadline_is_a_timer_due_at_the_visits_deadline(world: World) -> None:
    graph, instance = await started(world)
    [visit] = await world.rows(app.Visit)
    [timer] = await timers(world)
    assert visit.deadline_at == visit.entered_at + timedelta(seconds=DEADLINE)
    assert (timer.visit_id, timer.instance_id, timer.branch_id) == (
        visit.id,
        instance.id,
        only_branch(instance),
    )
    assert (timer.next_step, timer.wake_at, timer.wf_version) == ("expire", visit.deadline_at, 0)
    assert await next_instant(world) == visit.deadline_at
    assert visit.node_id == node_id(graph, "review")


async def test_a_workers_on_idle_sees_the_deadline(world: World) -> None:
    told: list[datetime | None] = []
    async with run_workflows(world.Session, workflows=[app.Timer], on_idle=told.append) as worker:
        assert await worker.wake(5)
        assert told[-1] is None
        await started(world)
        [visit] = await world.rows(app.Visit)
        for _ in range(400):
            if told[-1] is not None:
                break
            await asyncio.sleep(0.01)
        assert await worker.wake(5)
    assert told[-1] == visit.deadline_at


async def test_an_expired_deadline_escalates_along_the_escalation_edge(world: World) -> None:
    graph, instance = await started(world)
    assert await drain(world.Session, [app.Timer]) == 0  # not due yet
    await move_clock(world.Session, timedelta(seconds=DEADLINE + 1))
    assert await drain(world.Session, [app.Timer]) == 1
    now = await world.runtime.instance(instance.id)
    assert [b.node_key for b in now.branches] == ["manager"]
    assert now.branches[0].id == only_branch(instance)
    escalation = next(
        h for h in await world.runtime.history(instance.id) if h.metadata.get("escalated")
    )
    assert (escalation.action_type, escalation.actor, escalation.metadata["to_state"]) == (
        "status_change",
        None,
        "manager",
    )
    review = node_id(graph, "review")
    [visit] = await world.rows(app.Visit, app.Visit.node_id == review)
    assert (visit.status, visit.is_current) == ("completed", False)
    votes = await world.rows(app.Vote, app.Vote.visit_id == visit.id)
    assert {(v.status, v.is_available) for v in votes} == {("pending", False)}
    [timer] = await timers(world)
    # Finished by the engine when its step returned, not cancelled by the escalation.
    assert (timer.next_step, timer.last_error) == (None, None)
    assert await world.subject_state((await world.rows(app.Claim))[0]) == "manager"
    assert len(await world.events("duly.graph.state_assignment")) == 2


async def test_a_transition_before_the_deadline_cancels_the_timer(world: World) -> None:
    graph, instance = await started(world)
    await world.runtime.transition_branch(
        instance.id, only_branch(instance), node_id(graph, "done"), "ann"
    )
    [timer] = await timers(world)
    assert (timer.next_step, timer.wake_at, timer.last_error, timer.wf_version) == (
        None,
        None,
        "cancelled",
        1,
    )
    await move_clock(world.Session, timedelta(seconds=DEADLINE + 1))
    assert await drain(world.Session, [app.Timer]) == 0
    assert [b.node_key for b in (await world.runtime.instance(instance.id)).branches] == ["done"]
    assert await next_instant(world) is None


async def test_an_escalation_does_nothing_if_the_state_was_left(world: World) -> None:
    graph, instance = await started(world)
    branch = only_branch(instance)
    [visit] = await world.rows(app.Visit)
    await world.runtime.transition_branch(instance.id, branch, node_id(graph, "done"), "abe")
    before = await world.runtime.history(instance.id)
    # A timer that fired as the person moved (or a retry after a crash) finds the visit gone.
    assert not await world.runtime.escalate(instance.id, branch, visit.id)
    assert await world.runtime.history(instance.id) == before
    # An escalation that succeeded, run again, does nothing either.
    other = await world.runtime.submit(await world.claim(), "sam", template_name="escalating")
    [first] = await world.rows(app.Visit, app.Visit.instance_id == other.id)
    assert await world.runtime.escalate(other.id, only_branch(other), first.id)
    assert not await world.runtime.escalate(other.id, only_branch(other), first.id)
    moved = await world.runtime.instance(other.id)
    assert [b.node_key for b in moved.branches] == ["manager"]


async def test_an_escalation_chain_arms_each_timer(world: World) -> None:
    _, instance = await started(world, escalating(manager_deadline=60))
    await move_clock(world.Session, timedelta(seconds=DEADLINE + 1))
    assert await drain(world.Session, [app.Timer]) == 1
    live = [t for t in await timers(world) if t.next_step is not None]
    [manager_visit] = await world.rows(app.Visit, app.Visit.is_current)
    assert [t.visit_id for t in live] == [manager_visit.id]
    assert await next_instant(world) == manager_visit.deadline_at
    await move_clock(world.Session, timedelta(seconds=61))
    assert await drain(world.Session, [app.Timer]) == 1
    now = await world.runtime.instance(instance.id)
    assert [b.node_key for b in now.branches] == ["director"]
    assert await next_instant(world) is None


async def test_a_deadline_without_an_escalation_edge_leaves_the_state(world: World) -> None:
    graph = escalating()
    edges = tuple(e for e in graph.edges if not e.escalation)
    plain = Graph(
        template_id=graph.template_id,
        name=graph.name,
        version=1,
        nodes=graph.nodes,
        edges=edges,
    )
    _, instance = await started(world, plain)
    await move_clock(world.Session, timedelta(seconds=DEADLINE + 1))
    assert await drain(world.Session, [app.Timer]) == 1
    now = await world.runtime.instance(instance.id)
    assert [b.node_key for b in now.branches] == ["review"]
    assert [h.action_type for h in await world.runtime.history(instance.id)] == [
        "creation",
        "assignment",
    ]


async def test_cancel_cancels_the_timers(world: World) -> None:
    _, instance = await started(world)
    await world.runtime.cancel(instance.id, "sam")
    [timer] = await timers(world)
    assert (timer.next_step, timer.last_error) == (None, "cancelled")
    assert await next_instant(world) is None
