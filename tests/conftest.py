"""The test session's PostgreSQL, and a fresh database for every test.

One embedded server (or DULY_TEST_DATABASE_URL) serves the session; each test
gets a database of its own, created empty and dropped WITH (FORCE), so a test
may commit, claim from several connections and processes, and kill sessions
without touching another test.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from sqlalchemy import MetaData
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from infra.embedded import EmbeddedPostgres, start_embedded


@dataclass
class Server:
    """Where the session's PostgreSQL is: a SQLAlchemy URL for any database on it."""

    base_url: str
    embedded: EmbeddedPostgres | None = None

    def url_for(self, database: str) -> str:
        return make_url(self.base_url).set(database=database).render_as_string(hide_password=False)

    def conninfo_for(self, database: str) -> str:
        return (
            make_url(self.url_for(database))
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    given = os.environ.get("DULY_TEST_DATABASE_URL")
    if given:
        url = make_url(given)
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        yield Server(url.render_as_string(hide_password=False))
        return
    embedded = start_embedded(tuned_for_tests=True)
    try:
        yield Server(embedded.url, embedded)
    finally:
        embedded.stop()


@dataclass
class Database:
    """A database of this test's own, and the engines opened on it."""

    name: str
    url: str
    conninfo: str
    engines: list[AsyncEngine] = field(default_factory=list)

    def engine(self, **kwargs: object) -> AsyncEngine:
        engine = create_async_engine(self.url, **kwargs)  # type: ignore[arg-type]
        self.engines.append(engine)
        return engine

    async def create(self, *metadatas: MetaData) -> async_sessionmaker[AsyncSession]:
        """Create the tables of `metadatas` and return a session factory for them."""
        engine = self.engine(pool_size=10)
        async with engine.begin() as conn:
            for metadata in metadatas:
                await conn.run_sync(metadata.create_all)
        return async_sessionmaker(engine, expire_on_commit=False)

    def sql(self, query: str, *params: object) -> list[tuple[object, ...]]:
        """Run one statement on a plain connection of its own; the rows it returned."""
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            cursor = conn.execute(query, params or None)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []


@contextlib.asynccontextmanager
async def fresh_database(server: Server) -> AsyncIterator[Database]:
    """A database of its own on the session's server, dropped (WITH FORCE) afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = server.conninfo_for("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    database = Database(name, server.url_for(name), server.conninfo_for(name))
    try:
        yield database
    finally:
        for engine in database.engines:
            await engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
async def db(server: Server) -> AsyncIterator[Database]:
    async with fresh_database(server) as database:
        yield database
