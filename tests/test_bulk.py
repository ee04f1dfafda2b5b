"""Bulk actions on runs, on a real database: the dry run, the batches, the claims left alone.

- the dry run counts and writes nothing: test_the_dry_run_counts_and_writes_nothing
- a batch skips a run a real worker's lease holds: test_a_run_a_worker_holds_is_skipped_and_counted
- batches of BATCH_SIZE, taken up again from a continuation: test_batches_go_on_from_a_continuation
- the snapshot bound and the confirmation: test_rows_past_the_dry_runs_key_are_left_alone,
  test_more_matching_rows_than_confirmed_are_refused
- cancel: test_cancel_ends_the_matching_runs
- a key of two columns: test_a_composite_key_is_walked_and_bounded_as_one
- a row locked by another transaction:
  test_a_row_another_transaction_holds_is_passed_over_not_waited_on
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows, run_workflows
from engine.bulk import (
    AuditActor,
    BulkCancel,
    BulkChangedError,
    BulkProgress,
    BulkRun,
    apply_runs,
    plan_runs,
    resume_runs,
    start_runs,
)
from engine.model.connection import WorkflowConnection, current_connection
from engine.views.runs import RunFilter
from tests.apps import chores
from tests.apps.chores import Chore, Shift
from tests.bulk_helpers import add_failed, audit
from tests.conftest import Database
from tests.helpers import wait_until

OPS = AuditActor("ops@example.com", "cli")
FAILED = RunFilter(state="failed")


@pytest.fixture(autouse=True)
def fresh_gate() -> Iterator[None]:
    chores.gate.clear()
    chores.held.clear()
    yield
    chores.gate.set()


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(chores.Base.metadata)


async def test_a_composite_key_is_walked_and_bounded_as_one(
    db: Database, Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.bulk.runs.BATCH_SIZE", 2)
    keys = [("a", 2), ("a", 10), ("b", 1), ("b", 3), ("c", 0)]
    rows = [{"team": t, "day": d, "last_error": "RuntimeError: boom"} for t, d in keys]
    async with Session.begin() as session:
        await session.execute(insert(Shift), rows)
    async with connect_workflows(Session, workflows=[Shift]):
        connection = current_connection()
        info = connection.workflows[0]
        plan = await plan_runs(connection, info, FAILED)
        assert (plan.matched, plan.to_dict()["upto"]) == (5, '["c", 0]')
        async with Session.begin() as session:  # failed after the dry run, past its key
            await session.execute(insert(Shift), [{"team": "d", "day": 1, "last_error": "x"}])
        action = BulkRun(Shift.work())
        progress = await start_runs(connection, info, FAILED, action, expected=5, upto=["c", 0])
        first = await anext(aiter(apply_runs(connection, info, FAILED, action, progress, OPS)))
        resumed = resume_runs(info, FAILED, action, first.encode())
        assert (resumed.after, resumed.upto) == (("a", 10), ("c", 0))
        rest = [p async for p in apply_runs(connection, info, FAILED, action, resumed, OPS)]
    assert [(p.done, p.finished) for p in [first, *rest]] == [(2, False), (4, False), (5, True)]
    stepped = db.sql("SELECT team, day FROM shift WHERE next_step = 'work' ORDER BY team, day")
    assert stepped == keys, "every confirmed run, and not the one failed since"


@pytest.fixture
async def connection(
    Session: async_sessionmaker[AsyncSession],
) -> AsyncIterator[WorkflowConnection]:
    async with connect_workflows(Session, workflows=[Chore]):
        yield current_connection()


async def rows(Session: async_sessionmaker[AsyncSession]) -> list[Chore]:
    async with Session() as session:
        return list((await session.scalars(select(Chore).order_by(Chore.id))).all())


async def apply_all(
    connection: WorkflowConnection, filters: RunFilter, action: Any, progress: BulkProgress
) -> list[BulkProgress]:
    info = connection.workflows[0]
    return [p async for p in apply_runs(connection, info, filters, action, progress, OPS)]


async def test_the_dry_run_counts_and_writes_nothing(
    db: Database, Session: async_sessionmaker[AsyncSession], connection: WorkflowConnection
) -> None:
    await add_failed(Session, 3)
    before = [(r.id, r.wf_version, r.next_step) for r in await rows(Session)]
    plan = await plan_runs(connection, connection.workflows[0], FAILED)
    assert (plan.matched, plan.held, plan.upto) == (3, 0, (3,))
    assert plan.to_dict() == {
        "workflow": "chore", "dry_run": True, "expected": 3, "held": 0, "upto": "3",
    }  # fmt: skip
    assert [(r.id, r.wf_version, r.next_step) for r in await rows(Session)] == before
    assert await audit(db) == [], "a dry run records nothing"


async def test_a_run_a_worker_holds_is_skipped_and_counted(
    db: Database, Session: async_sessionmaker[AsyncSession]
) -> None:
    await add_failed(Session, 2)
    async with run_workflows(Session, workflows=[Chore]):
        holding = Chore(label="held")
        assert await holding.start(Chore.hold)
        await wait_until(lambda: chores.held == [holding.id], what="the worker holds the run")
        connection = current_connection()
        info = connection.workflows[0]
        everything = RunFilter()
        plan = await plan_runs(connection, info, everything)
        assert (plan.matched, plan.held) == (3, 1)
        action = BulkRun(Chore.work("bulk"))
        start = await start_runs(
            connection, info, everything, action, expected=plan.matched, upto=plan.upto
        )
        [last] = await apply_all(connection, everything, action, start)
        assert (last.done, last.skipped, last.total, last.finished) == (2, 1, 3, True)

        async def worked() -> bool:
            return [r.done for r in await rows(Session)] == [1, 1, 0]

        await wait_until(worked, what="the two free runs worked")
        still = next(r for r in await rows(Session) if r.id == holding.id)
        assert (still.next_step, still.claimed_until is not None) == ("hold", True), "untouched"
        chores.gate.set()
    [(actor, via, action_name, workflow, count, detail)] = await audit(db)
    assert (actor, via, action_name, workflow, count) == (OPS.id, "cli", "bulk.run", "chore", 2)
    assert detail["skipped"] == 1 and detail["batch"] == 1 and detail["bulk"] == start.bulk_id


async def test_batches_go_on_from_a_continuation(
    db: Database,
    Session: async_sessionmaker[AsyncSession],
    connection: WorkflowConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("engine.bulk.runs.BATCH_SIZE", 2)
    await add_failed(Session, 5)
    info = connection.workflows[0]
    action = BulkRun(Chore.work("again"))
    plan = await plan_runs(connection, info, FAILED)
    progress = await start_runs(connection, info, FAILED, action, expected=5, upto=plan.upto)
    first = await anext(aiter(apply_runs(connection, info, FAILED, action, progress, OPS)))
    assert (first.done, first.batches, first.finished) == (2, 1, False)
    resumed = resume_runs(info, FAILED, action, first.encode())
    assert (resumed.after, resumed.upto, resumed.bulk_id) == ((2,), (5,), first.bulk_id)
    rest = await apply_all(connection, FAILED, action, resumed)
    assert [(p.done, p.batches, p.finished) for p in rest] == [(4, 2, False), (5, 3, True)]
    assert all(r.next_step == "work" for r in await rows(Session))
    assert [(r[4], r[5]["batch"]) for r in await audit(db)] == [(2, 1), (2, 2), (1, 3)]
    with pytest.raises(BulkChangedError, match="another action or filter"):
        resume_runs(info, RunFilter(state="finished"), action, first.encode())


async def test_rows_past_the_dry_runs_key_are_left_alone(
    Session: async_sessionmaker[AsyncSession], connection: WorkflowConnection
) -> None:
    await add_failed(Session, 2)
    info = connection.workflows[0]
    plan = await plan_runs(connection, info, FAILED)
    await add_failed(Session, 1)  # failed after the dry run: nobody confirmed it
    action = BulkRun(Chore.work())
    start = await start_runs(connection, info, FAILED, action, expected=2, upto=plan.upto)
    [last] = await apply_all(connection, FAILED, action, start)
    assert (last.done, last.skipped) == (2, 0)
    assert [r.next_step for r in await rows(Session)] == ["work", "work", None]


async def test_more_matching_rows_than_confirmed_are_refused(
    db: Database, Session: async_sessionmaker[AsyncSession], connection: WorkflowConnection
) -> None:
    await add_failed(Session, 3)
    info = connection.workflows[0]
    one = RunFilter(error="boom", key="2")
    plan = await plan_runs(connection, info, FAILED)
    assert plan.matched == 3
    with pytest.raises(BulkChangedError, match="now matches 3 chore runs up to key 3"):
        await start_runs(connection, info, FAILED, BulkCancel(), expected=2, upto=plan.upto)
    assert await audit(db) == []
    progress = await start_runs(connection, info, one, BulkCancel(), expected=1, upto=plan.upto)
    assert progress.total == 1


async def test_cancel_ends_the_matching_runs(
    Session: async_sessionmaker[AsyncSession], connection: WorkflowConnection
) -> None:
    info = connection.workflows[0]
    for label in ("a", "b"):
        assert await Chore(label=label).start(Chore.work)
    live = RunFilter(state="scheduled")
    plan = await plan_runs(connection, info, live)
    start = await start_runs(connection, info, live, BulkCancel(), expected=2, upto=plan.upto)
    [last] = await apply_all(connection, live, BulkCancel(), start)
    assert (last.done, last.skipped) == (2, 0)
    assert [r.last_error for r in await rows(Session)] == ["cancelled", "cancelled"]


async def test_a_row_another_transaction_holds_is_passed_over_not_waited_on(
    Session: async_sessionmaker[AsyncSession], connection: WorkflowConnection
) -> None:
    info = connection.workflows[0]
    for label in ("x", "y"):
        assert await Chore(label=label).start(Chore.work)
    live = RunFilter(state="scheduled")
    plan = await plan_runs(connection, info, live)
    async with Session.begin() as holder:  # another transaction holds run 1 locked throughout
        await holder.execute(select(Chore.id).where(Chore.id == 1).with_for_update())
        start = await start_runs(connection, info, live, BulkCancel(), expected=2, upto=plan.upto)
        [last] = await apply_all(connection, live, BulkCancel(), start)
        assert (last.done, last.skipped, last.finished) == (1, 1, True), "skipped, not waited on"
    assert [r.last_error for r in await rows(Session)] == [None, "cancelled"]
