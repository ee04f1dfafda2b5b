"""Concurrent writes to one instance: the instance lock serializes them.

Each test runs its writers as tasks on connections of their own, truly at
the same time: a lock held by a third connection, or a hook inside the
first writer's locked transaction (the directory it asks), holds them
until every one has started and is waiting.

- two people move the same branch at the same moment: exactly one moves, the
  other is refused with a StateWorkflowError saying the branch is no longer
  on that state, and history shows one move:
  test_two_people_moving_one_branch_at_once_move_it_once,
  test_a_move_waiting_behind_another_is_refused_once_it_has_moved
- two votes of a majority cast at once both count: the branch moves exactly
  once: test_two_votes_at_once_both_count
- the two branches of a fork reaching their join at once fire it exactly
  once: test_two_branches_reaching_a_join_at_once_fire_it_once
- two submits of one subject at once start one instance; the other is
  refused: test_two_submits_of_one_subject_at_once_start_one_instance

The lock is the move's to its COMMIT:
- a move that reads its subject (a condition routes on it) keeps its transaction,
  and the instance's lock, to its COMMIT: test_reading_the_subject_keeps_the_moves_lock
- a move cancelled while it waits for the lock leaves no connection behind in a
  transaction: the next move on the one pooled connection moves:
  test_a_move_cancelled_while_it_waits_leaves_the_pool_usable
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Collection
from typing import Any

import psycopg
import pytest
from sqlalchemy import select

from engine import DatabaseEventRegistry, connect_workflows
from engine.base.errors import StateWorkflowError, WorkflowSubmissionError
from engine.graphs.design.model import Graph
from engine.graphs.moves.conditions import ConditionRegistry
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.snapshots import InstanceSnapshot, TransitionOutcome
from engine.graphs.tables import CONDITION, END, FORK, JOIN, START, STATE
from engine.model.connection import session_engine
from tests.apps import graphs as app, outbox as outbox_app
from tests.conftest import Database
from tests.graph_helpers import FORKED, FORKED_EDGES, graph_of
from tests.graph_world import (
    TABLES,
    World,
    make_world,
    node_id,
    one_connection,
    only_branch,
    submitted,
    until_a_lock_is_awaited,
)
from tests.helpers import sessions_waiting_for_a_lock, wait_until

ROUNDS = 4  # each race is run this many times
WAIT = 5.0  # seconds a writer may take to start waiting

REVIEW: dict[str, Any] = {
    "start": START,
    "review": {
        "type": STATE,
        "state_code": "review",
        "assignee_users": ["ann", "abe"],
        "assignee_groups": ["board"],
    },
    "approved": (STATE, "approved", ["cat"]),
    "rework": (STATE, "rework", ["bob"]),
    "end": END,
}
REVIEW_EDGES: list[Any] = [
    ("start", "review"),
    ("review", "approved"),
    ("review", "rework"),
    ("approved", "end"),
    ("rework", "end"),
]


@pytest.fixture
async def world(db: Database) -> AsyncIterator[World]:
    async for made in make_world(db, groups={"board": ["amy", "ben", "cy"]}):
        yield made


async def until_waiting(world: World, count: int) -> None:
    """Until `count` sessions of this test's database wait for a lock together."""
    engine = session_engine(world.Session)

    async def waiting() -> bool:
        return await sessions_waiting_for_a_lock(engine) >= count

    await wait_until(waiting, WAIT, interval=0.01, what=f"{count} writers waiting for the lock")


async def race(world: World, instance_id: uuid.UUID, *writers: Any) -> list[Any]:
    """Run `writers` while another connection holds the instance's lock; then let them go."""
    instances = app.Instance.__table__
    async with session_engine(world.Session).connect() as blocker:
        transaction = await blocker.begin()
        await blocker.execute(
            select(instances.c.id).where(instances.c.id == instance_id).with_for_update()
        )
        tasks = [asyncio.create_task(writer) for writer in writers]
        await until_waiting(world, len(tasks))
        await transaction.commit()
    return await asyncio.gather(*tasks, return_exceptions=True)


def split(results: list[Any]) -> tuple[list[TransitionOutcome], list[BaseException]]:
    done = [r for r in results if isinstance(r, TransitionOutcome)]
    failed = [r for r in results if isinstance(r, BaseException)]
    return done, failed


async def moves(world: World, instance_id: uuid.UUID) -> int:
    entries = await world.runtime.history(instance_id)
    return sum(1 for e in entries if e.action_type == "status_change")


async def review(world: World) -> tuple[Graph, InstanceSnapshot]:
    graph = await world.store(graph_of(REVIEW, REVIEW_EDGES, name="review"))
    return graph, await world.runtime.submit(await world.claim(), "sam", template_name="review")


async def test_two_people_moving_one_branch_at_once_move_it_once(world: World) -> None:
    graph, _ = await review(world)
    for _ in range(ROUNDS):
        instance = await world.runtime.submit(await world.claim(), "sam", template_name="review")
        branch = only_branch(instance)
        results = await race(
            world,
            instance.id,
            world.runtime.transition_branch(
                instance.id, branch, node_id(graph, "approved"), "ann", "yes"
            ),
            world.runtime.transition_branch(
                instance.id, branch, node_id(graph, "rework"), "abe", "no"
            ),
        )
        done, failed = split(results)
        assert len(done) == 1 and len(failed) == 1, results
        assert isinstance(failed[0], StateWorkflowError)
        assert "the branch is on" in str(failed[0])
        winner = done[0]
        now = await world.runtime.instance(instance.id)
        assert [b.node_id for b in now.branches] == [winner.target_id]
        assert await moves(world, instance.id) == 1
        cast = await world.rows(
            app.Vote, app.Vote.instance_id == instance.id, app.Vote.status == "approved"
        )
        assert [v.target_node_id for v in cast] == [winner.target_id]


class Held:
    """A directory whose first answer waits until released: a hook inside a locked transaction."""

    def __init__(self, groups: dict[str, list[str]]) -> None:
        self.groups = groups
        self.armed = False  # set once the instance is submitted
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def members(self, group: str) -> Collection[str]:
        if self.armed and not self.entered.is_set():
            self.entered.set()
            await asyncio.wait_for(self.release.wait(), WAIT)
        return self.groups.get(group, [])


async def test_a_move_waiting_behind_another_is_refused_once_it_has_moved(world: World) -> None:
    graph, _ = await review(world)
    for _ in range(ROUNDS):
        held = Held({"board": ["amy"]})
        runtime = GraphRuntime(TABLES, directory=held, events=world.registry)
        instance = await runtime.submit(await world.claim(), "sam", template_name="review")
        held.armed = True
        branch = only_branch(instance)
        # The first holds the instance's lock while it asks the directory who may move.
        first = asyncio.create_task(
            runtime.transition_branch(instance.id, branch, node_id(graph, "approved"), "ann")
        )
        await asyncio.wait_for(held.entered.wait(), WAIT)
        second = asyncio.create_task(
            runtime.transition_branch(
                instance.id,
                branch,
                node_id(graph, "approved"),
                "amy",
                source_node_id=node_id(graph, "review"),
            )
        )
        await until_waiting(world, 1)
        held.release.set()
        moved = await first
        with pytest.raises(StateWorkflowError, match="no longer on 'review'"):
            await second
        assert moved.moved
        assert await moves(world, instance.id) == 1


async def test_two_votes_at_once_both_count(db: Database) -> None:
    async for world in make_world(db, groups={"board": ["amy", "ben", "cy"]}):
        nodes = {
            **REVIEW,
            "review": {
                "type": STATE,
                "state_code": "review",
                "assignee_groups": ["board"],
                "approval_threshold": "majority",
            },
        }
        graph = await world.store(graph_of(nodes, REVIEW_EDGES, name="review"))
        for _ in range(ROUNDS):
            instance = await world.runtime.submit(
                await world.claim(), "sam", template_name="review"
            )
            branch, approved = only_branch(instance), node_id(graph, "approved")
            results = await race(
                world,
                instance.id,
                world.runtime.transition_branch(instance.id, branch, approved, "amy"),
                world.runtime.transition_branch(instance.id, branch, approved, "ben"),
            )
            done, failed = split(results)
            assert failed == [] and sorted(o.moved for o in done) == [False, True]
            assert sorted(o.approved_count for o in done) == [1, 2]
            assert await moves(world, instance.id) == 1


async def test_two_branches_reaching_a_join_at_once_fire_it_once(world: World) -> None:
    assert FORKED["fork"]["type"] == FORK and FORKED["join"] == JOIN
    graph = await world.store(graph_of(FORKED, FORKED_EDGES, name="forked"))
    for _ in range(ROUNDS):
        instance = await world.runtime.submit(await world.claim(), "sam", template_name="forked")
        forked = await world.runtime.transition_branch(
            instance.id, only_branch(instance), node_id(graph, "fork"), "ann"
        )
        legal, finance = forked.instance.branches
        join = node_id(graph, "join")
        results = await race(
            world,
            instance.id,
            world.runtime.transition_branch(instance.id, legal.id, join, "lea"),
            world.runtime.transition_branch(instance.id, finance.id, join, "fin"),
        )
        done, failed = split(results)
        assert failed == [] and len(done) == 2
        now = await world.runtime.instance(instance.id)
        assert [b.node_key for b in now.branches] == ["final"]
        entries = await world.runtime.history(instance.id)
        assert [e.message for e in entries].count("Join 'join' activated.") == 1


class Gate:
    """A directory that lets its callers through only once two of them are inside."""

    def __init__(self) -> None:
        self.inside = 0
        self.both = asyncio.Event()

    async def members(self, group: str) -> Collection[str]:
        self.inside += 1
        if self.inside >= 2:
            self.both.set()
        await asyncio.wait_for(self.both.wait(), WAIT)
        return ["amy"]


async def test_two_submits_of_one_subject_at_once_start_one_instance(world: World) -> None:
    await world.store(graph_of(REVIEW, REVIEW_EDGES, name="review"))
    for _ in range(ROUNDS):
        runtime = GraphRuntime(TABLES, directory=Gate(), events=world.registry)
        claim = await world.claim()
        results = await asyncio.gather(
            runtime.submit(claim, "sam", template_name="review"),
            runtime.submit(claim, "sue", template_name="review"),
            return_exceptions=True,
        )
        started = [r for r in results if isinstance(r, InstanceSnapshot)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(started) == 1 and len(refused) == 1, results
        assert isinstance(refused[0], WorkflowSubmissionError)
        rows = await world.rows(app.Instance, app.Instance.subject_key == str(claim.id))
        assert [r.id for r in rows] == [started[0].id]
        assert len(await world.rows(app.History, app.History.instance_id == rows[0].id)) == 2


# -- the lock is the move's to its COMMIT ------------------------------------------------------


async def test_reading_the_subject_keeps_the_moves_lock(db: Database) -> None:
    locked: list[bool] = []
    conditions = ConditionRegistry()

    def large(claim: Any, instance: Any) -> bool:
        """Asked inside the move, after the subject was read: is the instance locked?"""
        with psycopg.connect(db.conninfo, autocommit=True) as other:
            try:
                query = "SELECT 1 FROM duly_graph_instances WHERE id = %s FOR UPDATE NOWAIT"
                other.execute(query, [instance["id"]])
                locked.append(False)
            except psycopg.errors.LockNotAvailable:
                locked.append(True)
        return bool(claim.amount > 1000)

    conditions.register("large", large)
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    engine = db.engine(pool_size=1, max_overflow=0)
    runtime = GraphRuntime(TABLES, engine=engine, conditions=conditions)
    nodes = {
        "start": START,
        "review": (STATE, "review", ["ann"]),
        "check": {"type": CONDITION, "condition": "large"},
        "board": (STATE, "board", ["bob"]),
        "end": END,
    }
    edges = [
        ("start", "review"),
        ("review", "check"),
        ("check", "board", {"condition_result": "true"}),
        ("check", "end", {"condition_result": "false"}),
        ("board", "end"),
    ]
    async with connect_workflows(Session):
        world = World(Session, runtime, DatabaseEventRegistry(), ConditionRegistry())
        graph, _, instance = await submitted(world, nodes, edges)
        outcome = await runtime.transition_branch(
            instance.id, only_branch(instance), node_id(graph, "check"), "ann"
        )
    assert outcome.instance.state_status == "completed"
    assert locked == [True]


async def test_a_move_cancelled_while_it_waits_leaves_the_pool_usable(db: Database) -> None:
    async with one_connection(db) as one:
        runtime, world = one.runtime, one.world
        graph, instance, branch = one.graph, one.instance, one.branch
        rework = node_id(graph, "rework")
        holder = await psycopg.AsyncConnection.connect(db.conninfo)
        try:
            await holder.execute(
                "SELECT 1 FROM duly_graph_instances WHERE id = %s FOR UPDATE", [instance.id]
            )
            move = asyncio.create_task(
                runtime.transition_branch(instance.id, branch, rework, "ann", "again")
            )
            await until_a_lock_is_awaited(world)
            move.cancel()
            with pytest.raises(asyncio.CancelledError):
                await move
        finally:
            await holder.rollback()
            await holder.close()
        outcome: Any = await runtime.transition_branch(instance.id, branch, rework, "ann", "x")
        assert outcome.moved
    assert (await world.actions(instance.id)).count("approval") == 1
