"""Hot statements on the driver's connection (`engine.base.driver.fetch`) act as SQLAlchemy's.

- the rows are SQLAlchemy's rows, by position, by attribute and by `_mapping`:
  test_rows_are_the_ones_sqlalchemy_returns
- a column type's result processing (a TypeDecorator) and its bind processing apply:
  test_a_type_decorator_converts_results_and_parameters
- a refused statement raises SQLAlchemy's own error class, and the connection goes on:
  test_a_refused_statement_raises_sqlalchemys_error
- a lost connection is invalidated, and the error says so:
  test_a_lost_connection_is_invalidated; and so is its pool's generation, as through
  SQLAlchemy: test_a_lost_connection_recycles_the_pool_it_came_from
- statement listeners hear it: test_cursor_listeners_hear_the_statement
- a statement SQLAlchemy renders per execution (an expanding IN) goes through SQLAlchemy:
  test_an_expanding_in_goes_through_sqlalchemy
- on a connection with no transaction, SQLAlchemy's commit() and rollback() apply to it,
  as after its own autobegin: test_commit_and_rollback_apply_as_after_autobegin
- arrays travel in binary, and arrive as the text format would bring them (quotes,
  braces, NULL-looking text, None, timestamps with their zone, ints of every width):
  test_arrays_arrive_as_sent
- `lost_connection` tells a database that went away (the server ended the connection; a
  connection refused; an error raised from one) from a statement's own failure (a
  timeout, a constraint): test_lost_connection_tells_an_outage_from_a_refusal
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import (
    ARRAY,
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    bindparam,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.base.driver import fetch, lost_connection, prepare
from tests.conftest import Database


class Shouted(TypeDecorator[str]):
    """Stored lower case, read upper case: both processors are visible in the values."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else value.lower()

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else value.upper()


metadata = MetaData()
things = Table(
    "driver_things",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(20), nullable=False),
    Column("word", Shouted(20)),
)


@pytest.fixture
async def engine(db: Database) -> AsyncIterator[AsyncEngine]:
    Session = await db.create(metadata)
    engine: AsyncEngine = Session.kw["bind"]
    async with engine.begin() as conn:
        await conn.execute(
            insert(things),
            [{"id": i, "name": f"n{i}", "word": f"Word{i}"} for i in range(1, 4)],
        )
    yield engine


async def test_rows_are_the_ones_sqlalchemy_returns(engine: AsyncEngine) -> None:
    statement = select(things.c.id, things.c.name, func.now().label("at")).order_by(things.c.id)
    async with engine.connect() as conn:
        ours = await fetch(conn, statement, {})
        theirs = (await conn.execute(statement)).all()
    assert [tuple(row) for row in ours] == [tuple(row) for row in theirs]
    assert [row.name for row in ours] == ["n1", "n2", "n3"]
    assert ours[0]._mapping == {"id": 1, "name": "n1", "at": theirs[0].at}


async def test_a_type_decorator_converts_results_and_parameters(engine: AsyncEngine) -> None:
    wanted = bindparam("wanted", type_=Shouted(20))
    statement = select(things.c.id, things.c.word).where(things.c.word == wanted)
    async with engine.connect() as conn:
        [row] = await fetch(conn, statement, {"wanted": "WORD2"})  # bound lower case
    assert (row.id, row.word) == (2, "WORD2")  # read upper case


async def test_a_refused_statement_raises_sqlalchemys_error(engine: AsyncEngine) -> None:
    statement = insert(things).values(id=bindparam("id"), name="again")
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(IntegrityError) as refused:
            await fetch(conn, statement, {"id": 1})
        assert not refused.value.connection_invalidated
        assert await fetch(conn, select(func.count()).select_from(things), {}) == [(3,)]


async def test_a_lost_connection_is_invalidated(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        await driver.close()  # as a server that went away leaves it
        with pytest.raises(OperationalError) as lost:
            await fetch(conn, select(things.c.id), {})
        assert lost.value.connection_invalidated
        assert conn.invalidated


async def test_cursor_listeners_hear_the_statement(engine: AsyncEngine) -> None:
    heard: list[tuple[str, str, Any]] = []

    def before(_c: Any, _cur: Any, statement: str, params: Any, context: Any, _m: Any) -> None:
        context.noted = "before"
        heard.append(("before", statement, params))

    def after(_c: Any, _cur: Any, statement: str, params: Any, context: Any, _m: Any) -> None:
        heard.append((context.noted, statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", before)
    event.listen(engine.sync_engine, "after_cursor_execute", after)
    try:
        async with engine.connect() as conn:
            await fetch(conn, select(things.c.id).where(things.c.id == bindparam("k")), {"k": 2})
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", before)
        event.remove(engine.sync_engine, "after_cursor_execute", after)
    assert [(when, params) for when, _, params in heard] == [("before", {"k": 2})] * 2
    assert "driver_things" in heard[0][1]


async def test_an_expanding_in_goes_through_sqlalchemy(engine: AsyncEngine) -> None:
    statement = select(things.c.id).where(things.c.id.in_(bindparam("ids", expanding=True)))
    async with engine.connect() as conn:
        rows = await fetch(conn, statement, {"ids": [1, 3]})
    assert sorted(row.id for row in rows) == [1, 3]


async def test_commit_and_rollback_apply_as_after_autobegin(engine: AsyncEngine) -> None:
    statement = insert(things).values(id=bindparam("id"), name="new")
    async with engine.connect() as conn:
        await fetch(conn, statement, {"id": 10})
        await conn.rollback()
        await fetch(conn, statement, {"id": 11})
        await conn.commit()
    async with engine.connect() as conn:
        ids = (await conn.execute(text("SELECT id FROM driver_things WHERE id > 3"))).all()
    assert [row.id for row in ids] == [11]


async def test_a_lost_connection_recycles_the_pool_it_came_from(
    db: Database, engine: AsyncEngine
) -> None:
    """As through SQLAlchemy: the other connections the pool opened before (a restarted
    server dropped them too) are replaced at their next checkout, not handed out stale."""
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as other:
        await other.scalar(text("SELECT 1"))  # opened, then back in the pool
    async with autocommit.connect() as conn:
        async with autocommit.connect() as second:  # the pooled one is in use: a new one
            await second.scalar(text("SELECT 1"))
        db.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        with pytest.raises(OperationalError):
            await fetch(conn, select(things.c.id), {})
    async with autocommit.connect() as fresh:  # every pooled connection predates the loss
        assert await fetch(fresh, select(func.count()).select_from(things), {}) == [(3,)]


async def test_lost_connection_tells_an_outage_from_a_refusal(engine: AsyncEngine) -> None:
    async def error_of(statement: str) -> Exception:
        async with engine.connect() as conn:
            try:
                await conn.execute(text(statement))
            except Exception as exc:
                return exc
        raise AssertionError(f"{statement!r} did not fail")

    ended = await error_of("SELECT pg_terminate_backend(pg_backend_pid())")
    timed_out = await error_of("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)")
    refused = await error_of("INSERT INTO driver_things (id, name) VALUES (1, 'again')")
    assert lost_connection(ended) and not lost_connection(timed_out)
    assert not lost_connection(refused)
    with pytest.raises(psycopg.OperationalError) as unreachable:
        await psycopg.AsyncConnection.connect("postgresql://nobody@127.0.0.1:1/none")
    assert lost_connection(unreachable.value)
    try:
        try:
            raise unreachable.value
        except psycopg.OperationalError as exc:
            raise RuntimeError("the handler's own wrapping") from exc
    except RuntimeError as wrapped:
        assert lost_connection(wrapped)


async def test_arrays_arrive_as_sent(engine: AsyncEngine) -> None:
    awkward = ['a "quoted", {braced} \\ word', "NULL", "", None, "ünï"]
    moments = [datetime(2026, 12, 1, 12, 0, tzinfo=UTC), None]
    numbers = [1, None, 2**40, -(2**31)]
    statement = select(
        bindparam("words", type_=ARRAY(Text())).label("words"),
        bindparam("moments", type_=ARRAY(DateTime(timezone=True))).label("moments"),
        bindparam("numbers", type_=ARRAY(BigInteger())).label("numbers"),
    )
    values = {"words": awkward, "moments": moments, "numbers": numbers}
    async with engine.connect() as conn:
        [ours] = await fetch(conn, statement, values)
        theirs = (await conn.execute(statement, values)).one()
        prepared = prepare(statement, conn.dialect)
    assert prepared is not None and "%(words)b" in prepared.text
    assert tuple(ours) == tuple(theirs) == (awkward, moments, numbers)
