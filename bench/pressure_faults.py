"""The pressures the bench puts on PostgreSQL during a phase, each an async context manager.

A held xmin (one session idle in a transaction that took an XID), REPEATABLE
READ readers scanning the hot tables, a storm of pg_terminate_backend aimed
at the workers' connections, and hundreds of idle connections. Each yields a
dict of what it did (counts), which the phase's figures carry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import IsolationLevel, sql

from bench.pressure_app import WORKER_APPLICATION

READERS = 4  # REPEATABLE READ sessions scanning the hot tables
TERMINATE_EVERY = 0.2  # seconds between two pg_terminate_backend of a worker connection
OPEN_AT_ONCE = 25  # idle connections opened concurrently
PRESSURE_APPLICATION = "duly-pressure-bench"  # the bench's own sessions, never terminated

# One of duly's worker connections (its pool's, its listener's), chosen at random.
TERMINATE_ONE = """
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
     WHERE datname = current_database() AND application_name IN (%s, 'duly-listener')
     ORDER BY random() LIMIT 1"""


async def connect(conninfo: str, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
    """A session of the bench's own, named so that the terminator leaves it alone."""
    return await psycopg.AsyncConnection.connect(
        conninfo, autocommit=autocommit, application_name=PRESSURE_APPLICATION
    )


@contextlib.asynccontextmanager
async def held_xmin(conninfo: str) -> AsyncIterator[dict[str, Any]]:
    """`BEGIN; SELECT txid_current();` then idle in transaction until the block ends."""
    conn = await connect(conninfo, autocommit=False)
    try:
        cursor = await conn.execute("SELECT txid_current()")  # psycopg BEGINs first
        row = await cursor.fetchone()
        yield {"held_xid": None if row is None else int(row[0])}
        await conn.rollback()
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def repeatable_readers(conninfo: str, tables: list[str]) -> AsyncIterator[dict[str, Any]]:
    """READERS sessions, each scanning every one of `tables` in a REPEATABLE READ loop."""
    done = {"readers": READERS, "scans": 0}
    stop = asyncio.Event()

    async def read() -> None:
        async with await connect(conninfo) as conn:
            await conn.set_isolation_level(IsolationLevel.REPEATABLE_READ)
            await conn.set_autocommit(False)
            while not stop.is_set():
                async with conn.transaction():
                    for table in tables:
                        await conn.execute(
                            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
                        )
                        done["scans"] += 1

    tasks = [asyncio.create_task(read()) for _ in range(READERS)]
    try:
        yield done
    finally:
        stop.set()
        await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def terminator(conninfo: str) -> AsyncIterator[dict[str, Any]]:
    """pg_terminate_backend of one of the workers' connections every TERMINATE_EVERY seconds."""
    done = {"every_s": TERMINATE_EVERY, "terminated": 0}
    stop = asyncio.Event()

    async def terminate() -> None:
        async with await connect(conninfo) as conn:
            while not stop.is_set():
                cursor = await conn.execute(TERMINATE_ONE, (WORKER_APPLICATION,))
                done["terminated"] += sum(1 for (killed,) in await cursor.fetchall() if killed)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), TERMINATE_EVERY)

    task = asyncio.create_task(terminate())
    try:
        yield done
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def idle_connections(conninfo: str, count: int) -> AsyncIterator[dict[str, Any]]:
    """`count` sessions opened (OPEN_AT_ONCE at a time) and held idle until the block ends."""
    opened: list[psycopg.AsyncConnection[Any]] = []
    try:
        for first in range(0, count, OPEN_AT_ONCE):
            batch = range(first, min(first + OPEN_AT_ONCE, count))
            opened += await asyncio.gather(*(connect(conninfo) for _ in batch))
        yield {"idle_connections": len(opened)}
    finally:
        await asyncio.gather(*(conn.close() for conn in opened))
