"""Rows a step writes with its commit (`engine.model.companions`): written exactly when the step's
fenced write lands, on either commit path.

- on the fast path they are CTEs of the write's own statement, for the writes that
  landed only: test_the_fast_path_writes_companions_of_landed_writes_only
- upserts add the summed columns and stamp the database time:
  test_a_companion_upsert_adds_summed_columns_and_stamps_the_time
- a write the fast path cannot take (a JSON column changed) writes its companions in
  the same transaction, after its typed statement:
  test_the_typed_path_writes_companions_in_the_same_transaction
- a companion refused by the database refuses the write with it (nothing half-written):
  test_a_refused_companion_refuses_its_write
- a step body attaches them with commit_with(), and only inside a step:
  test_a_step_attaches_companions_with_commit_with, test_commit_with_outside_a_step_refuses
- only plain columns can be carried: test_a_companion_refuses_columns_that_are_not_plain
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError

from engine import connect_workflows
from engine.claims.claim import Claim, claim_due
from engine.commits.fast import fast_fenced_writes, takes
from engine.commits.outcomes import AttemptRecord, Outcome, Write
from engine.model.companions import Companion, CompanionShape, commit_with
from engine.model.registry import workflow_info
from engine.testing import drain
from engine.worker.committer import Committer
from tests.apps import bounded
from tests.conftest import Database

LEASE = timedelta(minutes=5)
NOTES = bounded.Note.__table__
PLAIN = CompanionShape(NOTES, ("run_id", "topic", "count"))
UPSERT = CompanionShape(
    NOTES, ("run_id", "topic", "count"), ("run_id", "topic"), ("count",), ("written_at",)
)


async def claimed_runs(db: Database, n: int) -> tuple[Any, list[Any]]:
    Session = await db.create(bounded.Base.metadata)
    async with connect_workflows(Session, workflows=[bounded.Bounded]):
        for i in range(n):
            assert await bounded.Bounded(code=f"r{i}").start(bounded.Bounded.go)
    engine = Session.kw["bind"]
    async with engine.begin() as conn:
        rows = list(await claim_due(conn, workflow_info(bounded.Bounded), n, LEASE))
    return engine, sorted(rows, key=lambda row: row.id)


def write(row: Any, *companions: Companion, version: int | None = None, **changes: Any) -> Write:
    info = workflow_info(bounded.Bounded)
    claimed = row.wf_version if version is None else version
    return Write(
        Claim(info, (row.id,), claimed),
        Outcome(None, None, pending="discard", changes=changes),
        AttemptRecord(str(row.id), "go", 1, "ok", None, 1.0),
        companions=companions,
    )


async def test_the_fast_path_writes_companions_of_landed_writes_only(db: Database) -> None:
    engine, (first, second) = await claimed_runs(db, 2)
    landing = write(first, Companion(PLAIN, ((first.id, "a", 1), (first.id, "b", 2))))
    fenced = write(second, Companion(PLAIN, ((second.id, "a", 9),)), version=second.wf_version - 1)
    assert takes(landing) and takes(fenced)
    async with engine.begin() as conn:
        rows = await fast_fenced_writes(conn, [landing, fenced], attempt_log=None)
    assert [row is not None for row in rows] == [True, False]
    assert db.sql("SELECT run_id, topic, count FROM bounded_notes ORDER BY topic") == [
        (first.id, "a", 1),
        (first.id, "b", 2),
    ]


async def test_a_companion_upsert_adds_summed_columns_and_stamps_the_time(db: Database) -> None:
    engine, (row,) = await claimed_runs(db, 1)
    db.sql("INSERT INTO bounded_notes (run_id, topic, count) VALUES (%s, 'a', 5)", row.id)
    async with engine.begin() as conn:
        [written] = await fast_fenced_writes(
            conn, [write(row, Companion(UPSERT, ((row.id, "a", 2),)))], attempt_log=None
        )
    assert written is not None
    [(count, stamped)] = db.sql("SELECT count, written_at IS NOT NULL FROM bounded_notes")
    assert (count, stamped) == (7, True)


async def test_the_typed_path_writes_companions_in_the_same_transaction(db: Database) -> None:
    engine, (first, second) = await claimed_runs(db, 2)
    committer = Committer(
        engine.execution_options(isolation_level="AUTOCOMMIT"), None, LEASE, transactions=engine
    )
    committer.start()
    try:
        typed = write(first, Companion(PLAIN, ((first.id, "typed", 1),)), tags=["x"])
        assert not takes(typed)
        assert await committer.write(typed) is not None
        stale = write(second, Companion(PLAIN, ((second.id, "stale", 1),)), tags=["y"], version=0)
        assert await committer.write(stale) is None
    finally:
        await committer.stop()
    assert db.sql("SELECT run_id, topic FROM bounded_notes") == [(first.id, "typed")]
    assert db.sql("SELECT tags FROM bounded WHERE id = %s", first.id) == [(["x"],)]


async def test_a_refused_companion_refuses_its_write(db: Database) -> None:
    engine, (row,) = await claimed_runs(db, 1)
    too_long = write(row, Companion(PLAIN, ((row.id, "much too long", 1),)))
    with pytest.raises(DBAPIError):
        async with engine.begin() as conn:
            await fast_fenced_writes(conn, [too_long], attempt_log=None)
    assert db.sql("SELECT count(*) FROM bounded_notes") == [(0,)]
    assert db.sql("SELECT next_step FROM bounded") == [("go",)]


async def test_a_step_attaches_companions_with_commit_with(db: Database) -> None:
    Session = await db.create(bounded.Base.metadata)
    async with connect_workflows(Session, workflows=[bounded.Bounded]):
        run = bounded.Bounded(code="s")
        assert await run.start(bounded.Bounded.note)
    assert await drain(Session, [bounded.Bounded]) == 1
    assert db.sql("SELECT run_id, topic, count FROM bounded_notes") == [(run.id, "step", 1)]


def test_commit_with_outside_a_step_refuses() -> None:
    with pytest.raises(RuntimeError, match="step body"):
        commit_with(Companion(PLAIN, ()))


def test_a_companion_refuses_columns_that_are_not_plain() -> None:
    shape = CompanionShape(bounded.Bounded.__table__, ("id", "tags"))
    with pytest.raises(TypeError, match="plain columns"):
        Companion(shape, ())
