"""`DurableWorkflowEngine`: executions as rows of a workflow table, rule by rule (its
execution states, its backends and the execution record), against a real PostgreSQL.

- durable workflows: start() writes a pending row whose step a worker runs, storing
  output and completed: test_start_queues_a_row_that_a_worker_completes
- a worker runs executions in the background; resume wakes a waiting one:
  test_a_background_worker_runs_executions_and_resume_wakes_a_waiting_one
- handler exceptions are captured as failed executions with the error text:
  test_a_failing_handler_leaves_a_failed_execution
- a workflow without a handler completes with empty output:
  test_a_definition_without_handler_completes_with_empty_output
- the handler is found by workflow_id among the definitions registered in the
  worker's process: test_a_worker_without_the_definition_fails_the_execution_saying_so
- correlation_id: workflow_id is the durable identity used with it; reused
  executions ignore new input and metadata (failed ones included); concurrent
  starts make one row: test_a_correlation_id_reuses_the_execution_and_ignores_new_input,
  test_concurrent_starts_with_one_correlation_id_make_one_execution
- empty or missing correlation ids create independent executions:
  test_empty_or_missing_correlation_ids_start_independent_executions
- the row stores state as a raw string, narrowed to WorkflowState when returned:
  test_the_state_is_raw_text_in_the_row_and_narrowed_in_snapshots
- returned executions are snapshots, not live objects; workers may move the row
  on right after start() returns: test_returned_executions_are_snapshots
- resume only when waiting; it records the signal under metadata["resume_signal"]
  and runs the handler with it: test_resume_delivers_the_signal_and_runs_the_handler_again,
  test_resume_is_valid_only_for_waiting_executions,
  test_two_concurrent_resumes_wake_the_execution_once
- cancel only when active; it stores the reason in error and ends the run:
  test_cancel_stores_its_reason_and_ends_the_run,
  test_cancel_is_valid_only_for_active_executions,
  test_cancel_while_the_handler_runs_discards_its_outcome
- status, resume and cancel of an unknown id: WorkflowExecutionNotFoundError:
  test_unknown_ids_are_not_found
- the record: execution state, JSON input/output, correlation id, timestamps,
  error, metadata; input must be JSON: test_the_record_holds_what_the_execution_is,
  test_input_that_is_not_json_is_refused_before_anything_is_written
- the engine finds its table through the connection, or the class it is given:
  test_the_engine_finds_its_table_through_the_connection_or_as_given
- an execution's created, started, updated and finished times are the database clock's
  (which tests move): test_an_executions_times_are_the_database_clocks
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    ConfigurationError,
    InvalidWorkflowStateError,
    NotFoundError,
    WorkflowDefinition,
    WorkflowExecutionError,
    WorkflowExecutionNotFoundError,
    WorkflowState,
    connect_workflows,
    run_workflows,
    wait_for_resume,
)
from engine.base.clock import db_now
from engine.executions.durable import DurableWorkflowEngine
from engine.model.connection import session_engine
from engine.testing import drain, move_clock
from tests.apps import executions as app
from tests.apps.executions import APPROVAL, DOUBLING, NOOP, PAYMENT, Execution
from tests.conftest import Database
from tests.helpers import fetch, wait_until

Sessions = async_sessionmaker[AsyncSession]


async def tables(db: Database) -> Sessions:
    return await db.create(app.Base.metadata)


def durable() -> DurableWorkflowEngine:
    return app.register_all(DurableWorkflowEngine())


async def database_time(Session: Sessions) -> datetime:
    async with session_engine(Session).connect() as conn:
        now: datetime = (await conn.execute(select(db_now()))).scalar_one()
    return now


async def test_start_queues_a_row_that_a_worker_completes(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        started = await engine.start(DOUBLING, {"n": 21}, metadata={"source": "test"})
        assert started.state == WorkflowState.PENDING
        row = await fetch(Session, Execution, started.execution_id)
        assert (row.next_step, row.state, row.output) == ("execute", "pending", None)
        assert str(uuid.UUID(started.execution_id, version=4)) == started.execution_id
        assert await drain(Session) == 1
        done = await engine.status(started.execution_id)
    assert done.state == WorkflowState.COMPLETED
    assert done.output_data == {"double": 42}
    assert done.metadata == {"source": "test"}
    assert done.error is None
    assert done.started_at is not None and done.finished_at is not None
    assert done.started_at <= done.finished_at
    row = await fetch(Session, Execution, started.execution_id)
    assert row.next_step is None  # the run is over


async def test_a_background_worker_runs_executions_and_resume_wakes_a_waiting_one(
    db: Database,
) -> None:
    Session = await tables(db)
    engine = durable()
    async with run_workflows(Session, workflows=[Execution]):
        doubled = await engine.start(DOUBLING, {"n": 4})
        waiting = await engine.start(APPROVAL, {"amount": 30})

        def reached(execution_id: str, state: WorkflowState) -> Any:
            async def check() -> bool:
                return (await engine.status(execution_id)).state == state

            return check

        await wait_until(reached(doubled.execution_id, WorkflowState.COMPLETED))
        assert (await engine.status(doubled.execution_id)).output_data == {"double": 8}
        await wait_until(reached(waiting.execution_id, WorkflowState.WAITING))
        row = await fetch(Session, Execution, waiting.execution_id)
        assert row.waiting_for == "resume"
        await engine.resume(waiting.execution_id, {"by": "maria"})
        await wait_until(reached(waiting.execution_id, WorkflowState.COMPLETED))
        done = await engine.status(waiting.execution_id)
    assert done.output_data == {"amount": 30, "approved_by": "maria"}
    assert done.metadata == {"resume_signal": {"by": "maria"}}


async def test_a_failing_handler_leaves_a_failed_execution(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        started = await engine.start(PAYMENT, {"card": "4242"})
        await drain(Session)
        failed = await engine.status(started.execution_id)
    assert (failed.state, failed.error) == (WorkflowState.FAILED, "card 4242 declined")
    assert failed.finished_at is not None
    row = await fetch(Session, Execution, started.execution_id)
    assert (row.attempts, row.last_error, row.next_step) == (0, None, None)  # no engine retry


async def test_a_definition_without_handler_completes_with_empty_output(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        started = await engine.start(NOOP, {"x": 1})
        await drain(Session)
        done = await engine.status(started.execution_id)
    assert (done.state, done.output_data) == (WorkflowState.COMPLETED, {})
    assert await fetch(Session, Execution, started.execution_id) is not None
    assert db.sql("SELECT output FROM duly_executions") == [({},)]


async def test_a_worker_without_the_definition_fails_the_execution_saying_so(
    db: Database,
) -> None:
    Session = await tables(db)
    unknown = WorkflowDefinition(f"unregistered-{uuid.uuid4().hex}", app.double)
    engine = durable()  # starts it, but no engine in this process registered it
    async with connect_workflows(Session):
        started = await engine.start(unknown, {"n": 1})
        await drain(Session)
        failed = await engine.status(started.execution_id)
    assert failed.state == WorkflowState.FAILED
    assert failed.error is not None
    assert unknown.workflow_id in failed.error and "register" in failed.error


async def test_a_correlation_id_reuses_the_execution_and_ignores_new_input(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        first = await engine.start(
            PAYMENT, {"card": "1"}, correlation_id="evt-1", metadata={"a": 1}
        )
        await drain(Session)
        again = await engine.start(
            PAYMENT, {"card": "2"}, correlation_id="evt-1", metadata={"b": 2}
        )
        assert await drain(Session) == 0  # nothing new to run
        other = await engine.start(DOUBLING, {"n": 1}, correlation_id="evt-1")
    assert again.execution_id == first.execution_id
    assert again.state == WorkflowState.FAILED  # failed executions are reused too
    assert (again.input_data, again.metadata) == ({"card": "1"}, {"a": 1})
    assert other.execution_id != first.execution_id  # the key is per workflow
    assert db.sql("SELECT count(*) FROM duly_executions") == [(2,)]


async def test_concurrent_starts_with_one_correlation_id_make_one_execution(
    db: Database,
) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        starts = [engine.start(DOUBLING, {"n": n}, correlation_id="order-7") for n in range(10)]
        executions = await asyncio.gather(*starts)
    assert len({e.execution_id for e in executions}) == 1
    assert len({tuple(e.input_data.items()) for e in executions}) == 1
    assert db.sql("SELECT count(*) FROM duly_executions") == [(1,)]


async def test_empty_or_missing_correlation_ids_start_independent_executions(
    db: Database,
) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        ids = {
            (await engine.start(NOOP, correlation_id=key)).execution_id
            for key in (None, None, "", "")
        }
    assert len(ids) == 4


async def test_the_state_is_raw_text_in_the_row_and_narrowed_in_snapshots(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        started = await engine.start(NOOP)
        await drain(Session)
        done = await engine.status(started.execution_id)
        assert db.sql("SELECT state FROM duly_executions") == [("completed",)]
        assert type(done.state) is WorkflowState
        db.sql("UPDATE duly_executions SET state = 'paused'")
        with pytest.raises(WorkflowExecutionError, match="'paused'") as unknown:
            await engine.status(started.execution_id)
    assert unknown.value.execution_id == started.execution_id


async def test_returned_executions_are_snapshots(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    data = {"n": 5}
    async with connect_workflows(Session):
        started = await engine.start(DOUBLING, data)
        data["n"] = 6
        started.input_data["n"] = 7  # type: ignore[index]
        await drain(Session)
        done = await engine.status(started.execution_id)
    assert started.state == WorkflowState.PENDING  # what it was when returned
    assert done.input_data == {"n": 5}
    assert done.output_data == {"double": 10}


async def test_resume_delivers_the_signal_and_runs_the_handler_again(db: Database) -> None:
    Session = await tables(db)
    seen: list[Mapping[str, Any]] = []

    def handler(given: Mapping[str, Any]) -> object:
        seen.append(given)
        if "resume_signal" not in given:
            return wait_for_resume()
        return {"approved_by": given["resume_signal"]["by"]}

    definition = WorkflowDefinition(f"approval-{uuid.uuid4().hex}", handler)
    engine = DurableWorkflowEngine()
    engine.register(definition)
    async with connect_workflows(Session):
        started = await engine.start(definition, {"amount": 10})
        await drain(Session)
        assert (await engine.status(started.execution_id)).state == WorkflowState.WAITING
        resumed = await engine.resume(started.execution_id, {"by": "ann"})
        assert resumed.state == WorkflowState.RUNNING
        assert resumed.metadata == {"resume_signal": {"by": "ann"}}
        assert await drain(Session) == 1
        done = await engine.status(started.execution_id)
    assert done.state == WorkflowState.COMPLETED
    assert done.output_data == {"approved_by": "ann"}
    assert done.metadata["resume_signal"] == {"by": "ann"}
    assert seen == [{"amount": 10}, {"amount": 10, "resume_signal": {"by": "ann"}}]


async def test_resume_is_valid_only_for_waiting_executions(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        pending = await engine.start(DOUBLING, {"n": 1})
        with pytest.raises(InvalidWorkflowStateError, match="pending"):
            await engine.resume(pending.execution_id, {"by": "x"})
        await drain(Session)
        with pytest.raises(InvalidWorkflowStateError) as refused:
            await engine.resume(pending.execution_id, {"by": "x"})
        assert (await engine.status(pending.execution_id)).output_data == {"double": 2}
    error = refused.value
    assert (error.execution_id, error.operation, error.state, error.expected) == (
        pending.execution_id,
        "resume",
        "completed",
        ("waiting",),
    )
    assert pending.execution_id in str(error) and "completed" in str(error)


async def test_two_concurrent_resumes_wake_the_execution_once(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        started = await engine.start(APPROVAL, {"amount": 5})
        await drain(Session)
        results = await asyncio.gather(
            engine.resume(started.execution_id, {"by": "ann"}),
            engine.resume(started.execution_id, {"by": "bob"}),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(refused) == 1 and isinstance(refused[0], InvalidWorkflowStateError)
        assert await drain(Session) == 1
        done = await engine.status(started.execution_id)
    winner = next(r for r in results if not isinstance(r, BaseException))
    assert done.state == WorkflowState.COMPLETED
    assert done.output_data["approved_by"] == winner.metadata["resume_signal"]["by"]


async def test_cancel_stores_its_reason_and_ends_the_run(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        waiting = await engine.start(APPROVAL, {"amount": 1})
        await drain(Session)
        queued = await engine.start(DOUBLING, {"n": 2})  # pending: no worker has run it
        cancelled = await engine.cancel(queued.execution_id, reason="no longer needed")
        parked = await engine.cancel(waiting.execution_id, reason="withdrawn")
        assert await drain(Session) == 0  # nothing of either runs
        with pytest.raises(InvalidWorkflowStateError, match="cancelled"):
            await engine.resume(waiting.execution_id, {"by": "late"})
        assert await engine.status(queued.execution_id) == cancelled
    assert (cancelled.state, cancelled.error) == (WorkflowState.CANCELLED, "no longer needed")
    assert (parked.state, parked.error) == (WorkflowState.CANCELLED, "withdrawn")
    assert cancelled.finished_at is not None
    for execution_id in (queued.execution_id, waiting.execution_id):
        row = await fetch(Session, Execution, execution_id)
        assert (row.next_step, row.waiting_for, row.output) == (None, None, None)


async def test_cancel_is_valid_only_for_active_executions(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        done = await engine.start(NOOP)
        await drain(Session)
        with pytest.raises(InvalidWorkflowStateError, match="pending, running, waiting") as no:
            await engine.cancel(done.execution_id, reason="too late")
        cancelled = await engine.start(NOOP)
        await engine.cancel(cancelled.execution_id)
        with pytest.raises(InvalidWorkflowStateError, match="cancelled"):
            await engine.cancel(cancelled.execution_id)
        assert (await engine.status(done.execution_id)).error is None
    assert (no.value.operation, no.value.state) == ("cancel", "completed")


async def test_cancel_while_the_handler_runs_discards_its_outcome(db: Database) -> None:
    Session = await tables(db)
    release = asyncio.Event()
    entered = asyncio.Event()
    returned = asyncio.Event()

    async def slow(given: Mapping[str, Any]) -> Mapping[str, Any]:
        entered.set()
        await release.wait()
        returned.set()
        return {"finished": True}

    definition = WorkflowDefinition(f"slow-{uuid.uuid4().hex}", slow)
    engine = DurableWorkflowEngine()
    engine.register(definition)
    async with run_workflows(Session, workflows=[Execution]) as worker:
        started = await engine.start(definition)
        await asyncio.wait_for(entered.wait(), 5)
        running = await engine.status(started.execution_id)
        assert running.state == WorkflowState.RUNNING
        assert running.started_at is not None
        cancelled = await engine.cancel(started.execution_id, reason="stop")
        release.set()
        await asyncio.wait_for(returned.wait(), 5)
        assert await worker.wake(5)  # caught up: the step's commit has been tried
        after = await engine.status(started.execution_id)
    assert cancelled.state == WorkflowState.CANCELLED
    assert (after.state, after.error, after.output_data) == (WorkflowState.CANCELLED, "stop", {})


async def test_unknown_ids_are_not_found(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        for call in (engine.status("nope"), engine.resume("nope"), engine.cancel("nope")):
            with pytest.raises(WorkflowExecutionNotFoundError, match="'nope'") as missing:
                await call
            assert isinstance(missing.value, NotFoundError)
            assert missing.value.execution_id == "nope"


async def test_the_record_holds_what_the_execution_is(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        started = await engine.start(
            APPROVAL, {"amount": 3}, correlation_id="c-1", metadata={"tenant": "t"}
        )
        await drain(Session)
    row = await fetch(Session, Execution, started.execution_id)
    assert (row.workflow_id, row.version, row.state) == ("approval", "2", "waiting")
    assert (row.input, row.output, row.correlation_id) == ({"amount": 3}, None, "c-1")
    assert row.execution_metadata == {"tenant": "t"}
    assert row.created_at is not None and row.started_at is not None
    assert row.finished_at is None and row.error is None
    (index,) = db.sql(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'duly_executions' "
        "AND indexdef LIKE '%UNIQUE%correlation_id%'"
    )
    assert "WHERE (correlation_id IS NOT NULL)" in str(index[0])
    assert (
        db.sql(
            "SELECT data_type FROM information_schema.columns WHERE table_name = "
            "'duly_executions' AND column_name IN ('input', 'output', 'metadata')"
        )
        == [("jsonb",)] * 3
    )


async def test_input_that_is_not_json_is_refused_before_anything_is_written(
    db: Database,
) -> None:
    Session = await tables(db)
    engine = durable()
    async with connect_workflows(Session):
        with pytest.raises(WorkflowExecutionError, match="input must be JSON"):
            await engine.start(DOUBLING, {"n": object()})
        with pytest.raises(WorkflowExecutionError, match="metadata must be JSON"):
            await engine.start(DOUBLING, {"n": 1}, metadata={"at": {1, 2}})
    assert db.sql("SELECT count(*) FROM duly_executions") == [(0,)]


async def test_the_engine_finds_its_table_through_the_connection_or_as_given(
    db: Database,
) -> None:
    Session = await db.create(app.Base.metadata, app.OtherBase.metadata)
    found = durable()
    given = app.register_all(
        DurableWorkflowEngine(executions="tests.apps.executions.ArchivedExecution")
    )
    async with connect_workflows(Session, workflows=[Execution]):
        assert found.record_class() is Execution
        one = await found.start(DOUBLING, {"n": 1})
        other = await given.start(DOUBLING, {"n": 2})
        await drain(Session)
        assert (await given.status(other.execution_id)).output_data == {"double": 4}
        with pytest.raises(WorkflowExecutionNotFoundError):
            await given.status(one.execution_id)
    assert db.sql("SELECT count(*) FROM archived_executions") == [(1,)]
    assert db.sql("SELECT count(*) FROM duly_executions") == [(1,)]
    async with connect_workflows(Session, workflows=[app.ArchivedExecution]):
        assert DurableWorkflowEngine().record_class() is app.ArchivedExecution
    with pytest.raises(ConfigurationError, match="WorkflowExecutionRecord"):
        DurableWorkflowEngine(executions="tests.apps.executions.Base")
    Empty = await db.create()
    async with connect_workflows(Empty, workflows=[]):
        with pytest.raises(ConfigurationError, match="No execution table"):
            await DurableWorkflowEngine().status("x")


async def test_an_executions_times_are_the_database_clocks(db: Database) -> None:
    Session = await tables(db)
    engine = durable()
    await move_clock(Session, timedelta(days=-10))  # far from Python's clock
    async with connect_workflows(Session):
        before = await database_time(Session)
        done = await engine.start(DOUBLING, {"n": 1})
        waiting = await engine.start(APPROVAL, {"amount": 1})
        assert await drain(Session) == 2
        resumed = await engine.resume(waiting.execution_id, {"by": "ann"})
        queued = await engine.start(DOUBLING, {"n": 2})
        cancelled = await engine.cancel(queued.execution_id)
        done = await engine.status(done.execution_id)
        after = await database_time(Session)
    assert (done.state, cancelled.state) == (WorkflowState.COMPLETED, WorkflowState.CANCELLED)
    async with Session() as session:
        created = (await session.scalars(select(Execution.created_at))).all()
    written = (
        *created,
        done.started_at,
        done.updated_at,
        done.finished_at,
        resumed.started_at,
        resumed.updated_at,
        cancelled.updated_at,
        cancelled.finished_at,
    )
    assert all(time is not None and before <= time <= after for time in written), written
