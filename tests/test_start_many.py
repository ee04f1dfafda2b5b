"""Starting many runs at once: a batch per statement, unique keys still deciding.

- thousands of rows start in a few statements; each gets its key and runs
- a row started by start() or start_many() is left alike: every column loaded, detached
- a row hitting a unique key starts none and is answered False, in place
- one target for all or one per row (arguments and all)
- a listening worker is woken by the batch's NOTIFY, not its idle interval
- bad input is refused before anything is written
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import JSON, String, func, inspect, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, connect_workflows, run_workflows, start_many, step
from engine.base.errors import DulyError, InvalidArgumentError
from engine.runs.start import START_BATCH
from engine.testing import drain
from tests.conftest import Database
from tests.helpers import wait_until


class Base(DeclarativeBase):
    pass


class Signup(Base, Workflow):
    __tablename__ = "start_many_signups"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    greeted: Mapped[str | None] = mapped_column(String(200), default=None)
    profile: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)

    @step
    async def welcome(self, note: str = "hello") -> None:
        self.greeted = f"{note} {self.email}"


class Tagged(Base, Workflow):
    """Given an array column, which `unnest` would flatten: the multi-row VALUES path."""

    __tablename__ = "start_many_tagged"

    id: Mapped[int] = mapped_column(primary_key=True)
    tags: Mapped[list[str]] = mapped_column(ARRAY(String))

    @step
    async def go(self) -> None:
        return None


class Other(Base, Workflow):
    __tablename__ = "start_many_others"

    id: Mapped[int] = mapped_column(primary_key=True)

    @step
    async def go(self) -> None:
        return None


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(Base.metadata)


async def greeted(Session: async_sessionmaker[AsyncSession]) -> int:
    async with Session() as session:
        count = select(func.count()).select_from(Signup).where(Signup.greeted.isnot(None))
        return int((await session.execute(count)).scalar_one())


async def test_thousands_start_in_a_few_statements_and_each_runs(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    count = START_BATCH * 2 + 500
    rows = [Signup(email=f"u{n}@example.com") for n in range(count)]
    async with connect_workflows(Session, workflows=[Signup]):
        started = await start_many(rows, Signup.welcome)
    assert started == [True] * count
    assert len({row.id for row in rows}) == count and rows[7].next_step == "welcome"
    state = inspect(rows[7])
    assert state.detached and not state.modified and rows[7].attempts == 0
    assert await drain(Session, [Signup]) == count
    assert await greeted(Session) == count


async def test_a_row_started_alone_or_in_a_batch_is_left_alike(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    alone, batched = Signup(email="alone@example.com"), Signup(email="batched@example.com")
    async with connect_workflows(Session, workflows=[Signup]):
        assert await alone.start(Signup.welcome)
        assert await start_many([batched], Signup.welcome) == [True]
    columns = [attr.key for attr in inspect(Signup).column_attrs]
    for row in (alone, batched):
        state = inspect(row)
        assert state.detached and not state.modified and not state.unloaded, row.email
    differ = {"id", "email", "wake_at"}
    assert {k: getattr(alone, k) for k in columns if k not in differ} == {
        k: getattr(batched, k) for k in columns if k not in differ
    }
    assert (alone.id, batched.id) == (1, 2) and alone.wake_at <= batched.wake_at


async def test_a_row_hitting_a_unique_key_starts_none_and_is_answered_in_place(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with connect_workflows(Session, workflows=[Signup]):
        assert await Signup(email="taken@example.com").start(Signup.welcome)
        rows = [
            Signup(email="a@example.com"),
            Signup(email="taken@example.com"),
            Signup(email="b@example.com"),
            Signup(email="a@example.com"),  # the same key twice in one batch: the first wins
        ]
        started = await start_many(rows, Signup.welcome)
    assert started == [True, False, True, False]
    assert rows[0].id is not None and rows[2].id is not None and rows[1].id is None
    async with Session() as session:
        emails = (await session.scalars(select(Signup.email).order_by(Signup.id))).all()
    assert emails == ["taken@example.com", "a@example.com", "b@example.com"]


async def test_one_target_per_row_carries_its_arguments(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    rows = [Signup(email=f"{n}@example.com", profile={"n": [n]}) for n in range(3)]
    async with connect_workflows(Session, workflows=[Signup]):
        targets = [Signup.welcome(note=f"hi {n}") for n in range(3)]
        assert await start_many(rows, targets) == [True] * 3
    await drain(Session, [Signup])
    async with Session() as session:
        found = (await session.scalars(select(Signup.greeted).order_by(Signup.id))).all()
    assert found == [f"hi {n} {n}@example.com" for n in range(3)]
    assert [row.profile for row in rows] == [{"n": [n]} for n in range(3)]


async def test_array_columns_start_too(Session: async_sessionmaker[AsyncSession]) -> None:
    async with connect_workflows(Session, workflows=[Tagged]):
        assert await Tagged(id=1, tags=["x"]).start(Tagged.go)
        rows = [Tagged(id=n, tags=["a", f"b{n}"]) for n in range(3)]
        assert await start_many(rows, Tagged.go) == [True, False, True]
    async with Session() as session:
        found = (await session.execute(select(Tagged.id, Tagged.tags).order_by(Tagged.id))).all()
    assert [tuple(row) for row in found] == [(0, ["a", "b0"]), (1, ["x"]), (2, ["a", "b2"])]


async def test_a_listening_worker_is_woken_by_the_batch(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with run_workflows(
        Session, workflows=[Signup], max_idle_interval=timedelta(seconds=60)
    ) as worker:
        assert worker.listener is not None
        await asyncio.wait_for(worker.listener.connected.wait(), 5)
        await wait_until(lambda: worker.passes >= 1)
        rows = [Signup(email=f"w{n}@example.com") for n in range(50)]
        assert all(await start_many(rows, Signup.welcome))

        async def all_greeted() -> bool:
            return await greeted(Session) == 50

        await wait_until(all_greeted, timeout=10)


async def test_bad_input_is_refused_before_anything_is_written(
    Session: async_sessionmaker[AsyncSession], db: Database
) -> None:
    async with connect_workflows(Session, workflows=[Signup, Other]):
        assert await start_many([], Signup.welcome) == []
        with pytest.raises(InvalidArgumentError, match="one workflow"):
            await start_many([Signup(email="x@example.com"), Other()], Signup.welcome)
        with pytest.raises(InvalidArgumentError, match="2 for 3 rows"):
            await start_many([Signup(email=f"{n}@x") for n in range(3)], [Signup.welcome] * 2)
        with pytest.raises(DulyError):
            await start_many([Signup(email="y@example.com")], Other.go)
        started = Signup(email="z@example.com")
        assert await started.start(Signup.welcome)
        with pytest.raises(DulyError, match="already in the database"):
            await start_many([Signup(email="w@example.com"), started], Signup.welcome)
    assert db.sql("SELECT email FROM start_many_signups") == [("z@example.com",)]
