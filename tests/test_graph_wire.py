"""A move's statements on the wire (engine.graphs.wire, engine.graphs.pipeline): prepared
names of our own, the NOTIFY after the COMMIT, a move cut off mid-round-trip.

Prepared names:
- a move whose statements were deallocated behind its back (psycopg's DEALLOCATE
  ALL on a rollback, or anyone's) prepares them again and moves:
  test_a_move_after_its_statements_were_deallocated_moves
- a batch inside a transaction it did not begin never leans on names it cannot
  prove (a submit's outbox statement, prepared by the moves, then deallocated):
  test_a_submit_after_a_deallocation_sends_its_statements_unnamed
- one name alive proves the names prepared after it, so a transaction of the
  runtime's own that begins with a statement never prepared proves the oldest
  name before it trusts the others:
  test_a_transaction_begun_with_a_new_statement_proves_the_older_names
- a connection told not to prepare (`prepare_threshold=None`, as behind a pooler
  in transaction mode) gets no prepared statement of ours, and one that may gets
  them: test_no_statement_is_prepared_where_psycopg_would_prepare_none

The NOTIFY:
- the outbox's wake-up is heard after a move, and the move's events are
  committed by then: test_a_moves_notify_comes_after_its_commit
- a new deadline's timer is announced after the COMMIT too:
  test_a_new_timer_is_announced_after_the_commit
- no move's transaction holds PostgreSQL's notification lock through its COMMIT
  (moves commit together): test_a_moves_transaction_sends_no_notify

One transaction:
- a move that reads its subject (a condition routes on it) keeps its transaction,
  and the instance's lock, to its COMMIT: test_reading_the_subject_keeps_the_moves_lock

Cut off:
- a move cancelled while it waits for the server leaves no connection behind in
  a half-read state: the next move on the one pooled connection moves:
  test_a_move_cancelled_mid_round_trip_leaves_the_pool_usable
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from sqlalchemy import Integer, bindparam, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import DatabaseEventRegistry, EventSettings, connect_workflows
from engine.graphs.conditions import ConditionRegistry
from engine.graphs.pipeline import driven, fetch, fetch_all
from engine.graphs.runtime import GraphRuntime
from engine.graphs.tables import CONDITION, END, START, STATE
from engine.notify import CHANNEL
from tests.apps import graphs as app
from tests.apps import outbox as outbox_app
from tests.conftest import Database
from tests.graph_helpers import graph_of
from tests.test_graph_runtime import (
    LINEAR_EDGES,
    LINEAR_NODES,
    TABLES,
    World,
    node_id,
    one_connection,
    only_branch,
    submitted,
    until_a_lock_is_awaited,
)
from tests.test_graph_timers import escalating


def registry() -> DatabaseEventRegistry:
    return DatabaseEventRegistry(
        outbox=outbox_app.Outbox,
        settings=EventSettings(mode="production", async_delivery=True),
    )


async def ours(engine: AsyncEngine) -> list[str]:
    """The statements prepared under our names on `engine`'s one connection."""
    async with engine.connect() as conn:
        query = text("SELECT name FROM pg_prepared_statements WHERE name LIKE 'duly_graph_%'")
        names = list((await conn.execute(query)).scalars())
        await conn.commit()  # not the pool's ROLLBACK
    return names


async def deallocate_all(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.exec_driver_sql("DEALLOCATE ALL")
        await conn.commit()


async def test_a_move_after_its_statements_were_deallocated_moves(db: Database) -> None:
    async with one_connection(db, registry()) as one:
        engine, runtime, world = one.engine, one.runtime, one.world
        graph, instance, branch = one.graph, one.instance, one.branch
        review, rework = node_id(graph, "review"), node_id(graph, "rework")
        await runtime.transition_branch(instance.id, branch, rework, "ann", "again")
        assert await ours(engine)
        await deallocate_all(engine)
        assert not await ours(engine)
        outcome = await runtime.transition_branch(instance.id, branch, review, "bob")
        assert outcome.moved
        assert await ours(engine)  # prepared afresh
        outcome = await runtime.transition_branch(instance.id, branch, rework, "ann", "again")
        assert outcome.moved
    assert await world.actions(instance.id) == [
        "creation", "assignment",
        "approval", "status_change", "assignment",
        "approval", "status_change", "assignment",
        "approval", "status_change", "assignment",
    ]  # fmt: skip


async def test_a_submit_after_a_deallocation_sends_its_statements_unnamed(db: Database) -> None:
    async with one_connection(db, registry()) as one:
        engine, runtime, world = one.engine, one.runtime, one.world
        graph, instance, branch = one.graph, one.instance, one.branch
        # Moves prepare the outbox's statement, which a submit's write sends too.
        await runtime.transition_branch(instance.id, branch, node_id(graph, "rework"), "ann", "x")
        await runtime.transition_branch(instance.id, branch, node_id(graph, "review"), "bob")
        await deallocate_all(engine)
        claim = await world.claim()
        second = await runtime.submit(claim, "sam", template_name="claims")
        assert second.is_active
        assert len(await world.events("duly.graph.state_assignment")) == 4


async def test_a_transaction_begun_with_a_new_statement_proves_the_older_names(
    db: Database,
) -> None:
    await db.create(app.Base.metadata)
    engine = db.engine(pool_size=1, max_overflow=0)
    first, second, third = (
        select(bindparam(name, type_=Integer()).label(name)) for name in ("a", "b", "c")
    )
    async with engine.begin() as conn:
        assert await fetch(conn, first, {"a": 1}) == [{"a": 1}]
    async with engine.begin() as conn:
        assert await fetch(conn, second, {"b": 2}) == [{"b": 2}]
    await deallocate_all(engine)
    async with driven(engine) as conn:
        # Never prepared: this batch proves nothing by itself, yet what follows trusts it.
        assert await fetch(conn, third, {"c": 3}) == [{"c": 3}]
        assert await fetch_all(conn, [(second, {"b": 4})], commit=True) == [[{"b": 4}]]


async def test_no_statement_is_prepared_where_psycopg_would_prepare_none(db: Database) -> None:
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    unprepared = db.engine(pool_size=1, max_overflow=0, connect_args={"prepare_threshold": None})
    prepared = db.engine(pool_size=1, max_overflow=0)
    async with connect_workflows(Session):
        world = World(Session, GraphRuntime(TABLES), registry(), ConditionRegistry())
        graph = await world.store(graph_of(LINEAR_NODES, LINEAR_EDGES, name="claims"))
        review, rework = node_id(graph, "review"), node_id(graph, "rework")
        for engine, expected in ((unprepared, False), (prepared, True)):
            runtime = GraphRuntime(TABLES, engine=engine, events=registry())
            instance = await runtime.submit(await world.claim(), "sam", template_name="claims")
            branch = only_branch(instance)
            for _ in range(3):
                await runtime.transition_branch(instance.id, branch, rework, "ann", "again")
                await runtime.transition_branch(instance.id, branch, review, "bob")
            assert bool(await ours(engine)) is expected


async def test_a_moves_notify_comes_after_its_commit(db: Database) -> None:
    async with one_connection(db, registry()) as one:
        runtime, world = one.runtime, one.world
        graph, instance, branch = one.graph, one.instance, one.branch
        listener = await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True)
        try:
            await listener.execute(f'LISTEN "{CHANNEL}"')
            await runtime.transition_branch(
                instance.id, branch, node_id(graph, "rework"), "ann", "again"
            )
            heard = await anext(aiter(listener.notifies(timeout=5)))
        finally:
            await listener.close()
        assert heard.payload == outbox_app.Outbox.__table__.name
        # The events were committed when the workers were told.
        assert len(await world.events("duly.graph.state_assignment")) == 2


async def test_a_new_timer_is_announced_after_the_commit(db: Database) -> None:
    Session = await db.create(app.Base.metadata, outbox_app.Base.metadata)
    runtime = GraphRuntime(TABLES, events=registry())
    async with connect_workflows(Session):
        world = World(Session, runtime, registry(), ConditionRegistry())
        await world.store(escalating())
        listener = await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True)
        try:
            await listener.execute(f'LISTEN "{CHANNEL}"')
            await runtime.submit(await world.claim(), "sam", template_name="escalating")
            heard = set()
            async for notice in listener.notifies(timeout=5, stop_after=2):
                heard.add(notice.payload)
        finally:
            await listener.close()
        [timer] = await world.rows(app.Timer)
    assert heard == {app.Timer.__table__.name, outbox_app.Outbox.__table__.name}
    assert timer.next_step == "expire"


async def test_a_moves_transaction_sends_no_notify(db: Database) -> None:
    """A NOTIFY in a transaction makes its COMMIT take PostgreSQL's one notification lock
    until the commit is flushed: every notifying transaction would commit alone. While a
    move waits on the lock another transaction holds, its transaction has sent its lock
    statement; its write, the outbox rows and the COMMIT are one batch with the NOTIFY
    after the COMMIT. The statement text is what the server runs: no pg_notify in it."""
    async with one_connection(db, registry()) as one:
        engine, runtime = one.engine, one.runtime
        graph, instance, branch = one.graph, one.instance, one.branch
        for target, user in (("rework", "ann"), ("review", "bob")):
            await runtime.transition_branch(instance.id, branch, node_id(graph, target), user, "x")
        async with engine.connect() as conn:
            query = text("SELECT statement FROM pg_prepared_statements WHERE name LIKE 'duly%'")
            statements = list((await conn.execute(query)).scalars())
            await conn.commit()
    assert any("INSERT INTO outbox_events" in s or "queued AS" in s for s in statements)
    assert not [s for s in statements if "pg_notify" in s]


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
    runtime = GraphRuntime(TABLES, engine=engine, events=registry(), conditions=conditions)
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
        world = World(Session, runtime, registry(), ConditionRegistry())
        graph, _, instance = await submitted(world, nodes, edges)
        outcome = await runtime.transition_branch(
            instance.id, only_branch(instance), node_id(graph, "check"), "ann"
        )
    assert outcome.instance.state_status == "completed"
    assert locked == [True]


async def test_a_move_cancelled_mid_round_trip_leaves_the_pool_usable(db: Database) -> None:
    async with one_connection(db, registry()) as one:
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
