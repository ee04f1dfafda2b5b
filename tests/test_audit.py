"""The operators' audit trail: a record commits with its action, or not at all.

- written in the caller's transaction: a rolled-back action leaves no record
- its time is the database clock's (duly_clock moved, the record follows)
- read newest first, by workflow, before a record; values bounded, names checked
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.base.audit import MAX_STORED, recent_actions, record_action
from engine.base.errors import InvalidArgumentError
from engine.base.owned_tables import declare_owned_tables
from infra.testing.pytest_plugin import Clock
from tests.conftest import Database


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    metadata = MetaData()
    declare_owned_tables(metadata)
    return await db.create(metadata)


async def record(session: AsyncSession, action: str, workflow: str | None = "refund") -> None:
    await record_action(
        session,
        actor="mia",
        via="http",
        action=action,
        workflow=workflow,
        subject={"where": "state:failed"},
        count=3,
        detail={"step": "charge"},
    )


async def test_a_record_commits_with_its_action_or_not_at_all(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with Session() as session, session.begin():
        await record(session, "run.cancel")
    with pytest.raises(RuntimeError):
        async with Session() as session, session.begin():
            await record(session, "bulk.run")
            raise RuntimeError("the action failed after its record was written")
    async with Session() as session:
        entries = await recent_actions(session)
    assert [(e.actor, e.via, e.action, e.count) for e in entries] == [
        ("mia", "http", "run.cancel", 3)
    ]
    assert entries[0].subject == {"where": "state:failed"}
    assert entries[0].detail == {"step": "charge"}
    assert entries[0].to_dict()["at"] == entries[0].at.isoformat()


async def test_the_time_is_the_database_clock(
    Session: async_sessionmaker[AsyncSession], db: Database
) -> None:
    clock = Clock(Session)
    await clock.move(timedelta(days=3))
    async with Session() as session, session.begin():
        await record(session, "schedule.pause")
    ((at, now),) = db.sql("SELECT at, now() FROM duly_audit")
    assert timedelta(days=3) - timedelta(minutes=1) < at - now < timedelta(days=3, minutes=1)  # type: ignore[operator]


async def test_reads_go_newest_first_by_workflow_and_before_a_record(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with Session() as session, session.begin():
        for n in range(4):
            await record(session, f"action.{n}", workflow="refund" if n % 2 else "onboarding")
    async with Session() as session:
        newest = await recent_actions(session, limit=3)
        refunds = await recent_actions(session, workflow="refund")
        older = await recent_actions(session, before=newest[1].id)
    assert [e.action for e in newest] == ["action.3", "action.2", "action.1"]
    assert [e.action for e in refunds] == ["action.3", "action.1"]
    assert [e.action for e in older] == ["action.1", "action.0"]


async def test_bad_names_and_reads_are_refused_and_long_values_bounded(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    async with Session() as session:
        with pytest.raises(InvalidArgumentError, match="actor"):
            await record_action(
                session, actor="", via="http", action="x", workflow=None, subject=None
            )
        with pytest.raises(InvalidArgumentError, match="1 to 500"):
            await recent_actions(session, limit=0)
    async with Session() as session, session.begin():
        await record_action(
            session, actor="mia", via="cli", action="bulk.run", workflow=None, subject="x" * 100_000
        )
    async with Session() as session:
        (entry,) = await recent_actions(session)
    assert entry.subject == {"cut": '"' + "x" * (MAX_STORED - 1)}
