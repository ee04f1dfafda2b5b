"""The two commit paths agree: the same outcome writes the same row and the same attempt record.

The typed path (`commits.fenced_writes`) and the array-driven fast path
(`fast.fast_fenced_writes`) share what an outcome means
(`outcomes.outcome_values`); this checks the SQL they build from it. Both
writes go in one transaction, so they see the same database time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.claims.claim import Claim, claim_due
from engine.commits.fast import fast_fenced_writes, takes
from engine.commits.outcomes import AttemptRecord, Outcome, Write
from engine.commits.typed import fenced_writes
from engine.model.registry import ENGINE_COLUMNS, workflow_info
from functions import examples
from functions.examples import Onboarding, WorkflowAttempt
from tests.apps import bounded
from tests.conftest import Database

LEASE = timedelta(minutes=5)
HELD_EVENT = '{"step": "check", "event": true}'

OUTCOMES = {
    "retry after a backoff": Outcome(
        "check", {"n": 1}, attempts=2, last_error="ValueError: boom", wake_after=timedelta(30)
    ),
    "finished, dropping a held event": Outcome(None, None, attempts=0, pending="discard"),
    "next step held by this worker": Outcome(
        "check", {}, wake_after=timedelta(0), hold=timedelta(minutes=5)
    ),
    "next occurrence of a schedule": Outcome(
        "check", None, wake_at=datetime(2031, 1, 2, 9, tzinfo=UTC), pending="discard"
    ),
    "gave up": Outcome(None, None, attempts=4, last_error="RuntimeError: no", pending="discard"),
    "next step, announced": Outcome("activated", {"a": [1, 2]}, wake_after=timedelta(0)),
    # The row's own plain columns, which the fast path takes as arrays too.
    "own columns changed": Outcome(
        "check", {}, wake_after=timedelta(hours=1), changes={"nudges": 3, "status": "nudged"}
    ),
    "own column, run finished": Outcome(None, None, pending="discard", changes={"status": "done"}),
}


@pytest.mark.parametrize("outcome", OUTCOMES.values(), ids=list(OUTCOMES))
async def test_both_paths_write_the_same_row_and_attempt_record(
    db: Database, outcome: Outcome
) -> None:
    Session = await two_runs(db)
    info = workflow_info(Onboarding)
    # Both runs hold an event, so what becomes of it is compared too.
    db.sql(
        "UPDATE onboarding SET pending_event = %s::jsonb, recent_event_keys = '[\"k\"]'", HELD_EVENT
    )
    engine = Session.kw["bind"]
    async with engine.begin() as conn:
        claimed = {row.user_id: row for row in await claim_due(conn, info, 2, LEASE)}
        writes = {
            user: Write(
                Claim(info, (row.id,), row.wf_version),
                outcome,
                AttemptRecord(str(row.id), "check", 3, "ok", None, 1.25),
                announce=outcome.next_step == "activated",
            )
            for user, row in claimed.items()
        }
        assert takes(writes["fast"]), "the fast path must be able to take this outcome"
        [typed] = await fenced_writes(conn, [writes["typed"]], attempt_log=WorkflowAttempt)
        [fast] = await fast_fenced_writes(conn, [writes["fast"]], attempt_log=WorkflowAttempt)
        stored = {
            row.user_id: row._mapping for row in await conn.execute(select(Onboarding.__table__))
        }
    assert typed is not None and fast is not None
    assert engine_columns(stored["typed"]) == engine_columns(stored["fast"])
    assert own_columns(stored["typed"]) == own_columns(stored["fast"])
    assert stored["typed"]["wf_version"] == claimed["typed"].wf_version + 1
    assert typed.duly_notified == fast.duly_notified
    if outcome.hold is not None:  # a worker running the next step itself reads the row back
        assert engine_columns(fast._mapping) == engine_columns(stored["fast"])
        assert own_columns(fast._mapping) == own_columns(stored["fast"])
    else:  # anything else reads back only that it landed: decoding the row would cost more
        assert "next_step" not in fast._mapping
    logged = db.sql(
        "SELECT run_key, workflow, step, attempt, outcome, error, took_ms, finished_at "
        "FROM workflow_attempt ORDER BY run_key"
    )
    assert len(logged) == 2
    by_run = {row[0]: row[1:] for row in logged}
    assert by_run[str(claimed["typed"].id)] == by_run[str(claimed["fast"].id)]


async def test_a_fenced_write_is_not_logged_on_either_path(db: Database) -> None:
    Session = await two_runs(db)
    info = workflow_info(Onboarding)
    engine = Session.kw["bind"]
    async with engine.begin() as conn:
        claimed = {row.user_id: row for row in await claim_due(conn, info, 2, LEASE)}
        stale = {
            user: Write(
                Claim(info, (row.id,), row.wf_version - 1),  # another claim has moved it on
                Outcome(None, None, pending="discard"),
                AttemptRecord(str(row.id), "check", 1, "ok", None, 1.0),
            )
            for user, row in claimed.items()
        }
        assert await fenced_writes(conn, [stale["typed"]], attempt_log=WorkflowAttempt) == [None]
        assert await fast_fenced_writes(conn, [stale["fast"]], attempt_log=WorkflowAttempt) == [
            None
        ]
    assert db.sql("SELECT count(*) FROM workflow_attempt") == [(0,)]


async def test_both_paths_log_a_failures_traceback_and_arguments(db: Database) -> None:
    Session = await two_runs(db)
    info = workflow_info(Onboarding)
    engine = Session.kw["bind"]
    trace = 'Traceback (most recent call last):\n  File "x.py"\nValueError: boom\n'
    args = {"args": [1, "two"], "kwargs": {"nested": {"deep": [None, True]}}}
    async with engine.begin() as conn:
        claimed = {row.user_id: row for row in await claim_due(conn, info, 2, LEASE)}
        failed = {
            user: Write(
                Claim(info, (row.id,), row.wf_version),
                Outcome("check", {"n": 1}, attempts=1, last_error="ValueError: boom",
                        wake_after=timedelta(30)),
                AttemptRecord(str(row.id), "check", 1, "retry", "ValueError: boom", 2.0,
                              traceback=trace, args=args),
            )
            for user, row in claimed.items()
        }  # fmt: skip
        assert takes(failed["fast"])
        assert await fenced_writes(conn, [failed["typed"]], attempt_log=WorkflowAttempt) != [None]
        assert await fast_fenced_writes(conn, [failed["fast"]], attempt_log=WorkflowAttempt) != [
            None
        ]
    logged = db.sql("SELECT outcome, traceback, args FROM workflow_attempt ORDER BY run_key")
    assert logged == [("retry", trace, args), ("retry", trace, args)]


async def test_a_batch_with_one_failure_logs_null_for_the_attempts_that_succeeded(
    db: Database,
) -> None:
    Session = await two_runs(db)
    info = workflow_info(Onboarding)
    engine = Session.kw["bind"]
    async with engine.begin() as conn:
        claimed = {row.user_id: row for row in await claim_due(conn, info, 2, LEASE)}
        ok, failing = claimed["typed"], claimed["fast"]
        writes = [
            Write(
                Claim(info, (ok.id,), ok.wf_version),
                Outcome(None, None, pending="discard"),
                AttemptRecord(str(ok.id), "check", 1, "ok", None, 1.0),
            ),
            Write(
                Claim(info, (failing.id,), failing.wf_version),
                Outcome(None, None, attempts=1, last_error="ValueError: no", pending="discard"),
                AttemptRecord(str(failing.id), "check", 1, "failed", "ValueError: no", 1.0,
                              traceback="Traceback ...\nValueError: no\n", args={"args": []}),
            ),
        ]  # fmt: skip
        assert None not in await fast_fenced_writes(conn, writes, attempt_log=WorkflowAttempt)
    logged = db.sql("SELECT outcome, traceback, args FROM workflow_attempt ORDER BY outcome")
    assert logged == [
        ("failed", "Traceback ...\nValueError: no\n", {"args": []}),
        ("ok", None, None),
    ]


async def two_runs(db: Database) -> async_sessionmaker[AsyncSession]:
    """Two Onboarding runs due at `check`, one per commit path (users "typed" and "fast")."""
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session, workflows=[Onboarding]):
        for user in ("typed", "fast"):
            row = Onboarding(user_id=user, email=f"{user}@example.com")
            assert await row.start(Onboarding.check)
    return Session


def engine_columns(row: Any) -> dict[str, Any]:
    return {name: row[name] for name in ENGINE_COLUMNS}


def own_columns(row: Any) -> dict[str, Any]:
    return {name: row[name] for name in ("nudges", "status")}


async def test_the_fast_path_assigns_text_so_a_length_limit_is_checked_not_truncated(
    db: Database,
) -> None:
    Session = await db.create(bounded.Base.metadata)
    info = workflow_info(bounded.Bounded)
    async with connect_workflows(Session, workflows=[bounded.Bounded]):
        assert await bounded.Bounded(code="ok").start(bounded.Bounded.go)
    engine = Session.kw["bind"]
    async with engine.begin() as conn:
        [row] = await claim_due(conn, info, 1, LEASE)
    write = Write(
        Claim(info, (row.id,), row.wf_version),
        Outcome(None, None, pending="discard", changes={"code": "much too long"}),
        AttemptRecord(str(row.id), "go", 1, "ok", None, 1.0),
    )
    assert takes(write)
    with pytest.raises(DBAPIError, match="too long"):
        async with engine.begin() as conn:
            await fast_fenced_writes(conn, [write], attempt_log=None)
    assert db.sql("SELECT code FROM bounded") == [("ok",)]


def test_columns_of_other_types_take_the_typed_path() -> None:
    info = workflow_info(bounded.Bounded)
    for changes in ({"tags": ["a"]}, {"kind": "big"}):
        write = Write(
            Claim(info, (1,), 1),
            Outcome(None, None, changes=changes),
            AttemptRecord("1", "go", 1, "ok", None, 1.0),
        )
        assert not takes(write), changes
