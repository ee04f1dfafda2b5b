"""A PostgreSQL restart under a running worker is survived."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from engine import connect_workflows, run_workflows
from infra.embedded import EmbeddedPostgres, start_embedded
from tests.apps import chain
from tests.apps.chain import Chain
from tests.helpers import wait_until

RUNS = 300


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own: restarting the session's would disturb other tests."""
    server = start_embedded(tuned_for_tests=True)
    try:
        yield server
    finally:
        server.stop()


async def test_a_worker_reconnects_after_a_database_restart_and_finishes_every_run(
    own_server: EmbeddedPostgres,
) -> None:
    engine = create_async_engine(own_server.url, pool_size=10)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    async with engine.begin() as conn:
        await conn.run_sync(chain.Base.metadata.create_all)
    async with connect_workflows(Session, workflows=[Chain]):
        for _ in range(RUNS):
            assert await Chain().start(Chain.first)
    try:
        async with run_workflows(Session, workflows=[Chain]) as worker:

            async def some_done() -> bool:
                async with Session() as session:
                    done = await session.scalar(
                        select(func.count()).select_from(Chain).where(Chain.next_step.is_(None))
                    )
                    return bool(done)

            await wait_until(some_done, timeout=10)
            await asyncio.to_thread(own_server.restart)

            async def all_done() -> bool:
                try:
                    async with Session() as session:
                        left = await session.scalar(
                            select(func.count())
                            .select_from(Chain)
                            .where(Chain.next_step.isnot(None))
                        )
                        return left == 0
                except Exception:
                    return False

            await wait_until(all_done, timeout=60, interval=0.1)
            assert worker.listener is not None
            await asyncio.wait_for(worker.listener.connected.wait(), 10)
            assert worker.listener.reconnects >= 1
        async with Session() as session:
            done = (
                await session.execute(select(Chain.done, func.count()).group_by(Chain.done))
            ).all()
        assert done == [("abc", RUNS)]
    finally:
        await engine.dispose()
