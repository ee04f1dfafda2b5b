"""A connection kept by a loop (`engine.worker.held.HeldConnection`), given back when idle.

- blocks one after another use one connection: test_blocks_share_one_connection
- a statement the database refuses keeps it: test_a_refused_statement_keeps_the_connection
- a lost connection is dropped and the next block opens another:
  test_a_lost_connection_is_replaced
- close() gives it back to the pool: test_close_gives_it_back_to_the_pool
- a worker with nothing running keeps none checked out while it sleeps (a serverless
  database may suspend): test_an_idle_worker_keeps_no_connection_checked_out
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import run_workflows
from engine.worker.held import HeldConnection
from tests.apps import behaviour
from tests.apps.behaviour import Timer
from tests.conftest import Database
from tests.helpers import connections_checked_out, wait_until

BACKEND = text("SELECT pg_backend_pid()")


@pytest.fixture
async def engine(db: Database) -> AsyncIterator[AsyncEngine]:
    Session = await db.create(behaviour.Base.metadata)
    engine: AsyncEngine = Session.kw["bind"]
    yield engine.execution_options(isolation_level="AUTOCOMMIT")


async def backend(held: HeldConnection) -> Any:
    async with held.connect() as conn:
        return await conn.scalar(BACKEND)


async def test_blocks_share_one_connection(engine: AsyncEngine) -> None:
    held = HeldConnection(engine)
    first = await backend(held)
    assert await backend(held) == first
    assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    await held.close()


async def test_a_refused_statement_keeps_the_connection(engine: AsyncEngine) -> None:
    held = HeldConnection(engine)
    first = await backend(held)
    with pytest.raises(IntegrityError):
        async with held.connect() as conn:
            await conn.execute(text("CREATE TEMP TABLE once (id int primary key)"))
            await conn.execute(text("INSERT INTO once VALUES (1), (1)"))
    assert await backend(held) == first
    await held.close()


async def test_a_lost_connection_is_replaced(db: Database, engine: AsyncEngine) -> None:
    held = HeldConnection(engine)
    first = await backend(held)
    db.sql("SELECT pg_terminate_backend(%s)", first)
    with pytest.raises(OperationalError):
        await backend(held)
    second = await backend(held)
    assert second is not None and second != first
    await held.close()


async def test_close_gives_it_back_to_the_pool(engine: AsyncEngine) -> None:
    held = HeldConnection(engine)
    first = await backend(held)
    await held.close()
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    async with engine.connect() as conn:  # the pool hands out the connection it got back
        assert await conn.scalar(BACKEND) == first


async def test_an_idle_worker_keeps_no_connection_checked_out(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    engine: AsyncEngine = Session.kw["bind"]
    async with run_workflows(Session, workflows=[Timer], suspends_when_idle=True) as worker:
        await wait_until(lambda: worker.passes >= 1)
        # Past the pass, into its sleep: the connection goes back before the worker sleeps.
        await wait_until(lambda: connections_checked_out(engine) == 0)
        passes = worker.passes
        assert await worker.wake(5), "it sleeps caught up"
        await wait_until(lambda: connections_checked_out(engine) == 0)
        assert worker.passes > passes and connections_checked_out(engine) == 0
