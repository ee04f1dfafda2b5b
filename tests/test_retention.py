"""Retention: what duly owns is pruned after its period; the application's rows never.

The kinds, each with its own period (`engine.retention`): attempt-log rows,
processed outbox rows with their event records and delivery attempts,
finished durable executions. Rows are made by the engine (runs, a drained
outbox, executions run by a worker), then some are aged by moving their
timestamps back, or the database clock forward.

- a dry run counts exactly the rows past their period, per table:
  test_the_dry_run_counts_exactly_the_rows_past_their_period
- prune deletes exactly those; newer rows, dead letters (a dead-lettered row, and a
  processed row with a dead-lettered route), unfinished executions and every business
  row stay: test_prune_deletes_exactly_what_the_dry_run_counted_and_nothing_else
- the cutoff is the database clock's, so moving it ages the attempt log:
  test_the_cutoff_follows_the_database_clock
- a kind kept for good (`never`) is not pruned: test_a_kind_kept_for_good_is_not_pruned
- more rows than a batch: every one is deleted, each batch a transaction of its own
  (a reader sees the rows go batch by batch while the prune goes on) followed by a pause
  when it deleted rows, and rows sharing one timestamp across a batch's edge are neither
  skipped nor taken twice:
  test_each_batch_is_a_transaction_of_its_own
- max_batches bounds each walk of a pass, so every table moves on; the next pass goes on:
  test_max_batches_bounds_each_walk_so_every_table_moves_on
- a batch chooses its rows through the log's finished index and deletes them by TID:
  test_a_batch_is_chosen_through_the_index_and_deleted_by_tid
- settings: the defaults, the environment, `never`, and bad values refused naming every
  variable: test_settings_default_to_thirty_days, test_settings_read_the_environment,
  test_bad_settings_are_refused_naming_each_variable
- `duly prune` (functions.cli.main): a dry run by default (a table, or --json), --apply
  deletes, --older-than-days overrides the periods, a bad period is a usage error:
  test_duly_prune_counts_then_deletes
- the drain function's pass (DULY_PRUNE_ON_DRAIN): a few batches after routing, and
  nothing without the setting: test_the_drain_prunes_a_bounded_pass_when_asked
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest
from sqlalchemy import String, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    ConfigurationError,
    DatabaseEventRegistry,
    EventSettings,
    Workflow,
    WorkflowDefinition,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
    declare_engine_tables,
    step,
    wait_for_resume,
)
from engine.executions.durable import DurableWorkflowEngine
from engine.model.connection import open_connection
from engine.retention import Batch, RetentionSettings, count_prunable, prune, prune_scans
from engine.retention.pruning import BEGINNING, batch_statement
from engine.testing import drain, move_clock
from functions import cli
from functions.lambdas import work as lambda_work
from functions.lambdas.runtime import Budget, Runtime
from infra.aws.settings import AwsSettings
from tests.conftest import Database

APP = "tests.test_retention"  # this module is the app `duly prune` and the drain load
AGE = timedelta(days=40)  # past the default period of 30 days
Sessions = async_sessionmaker[AsyncSession]


class Base(DeclarativeBase):
    """The retention tests' own base."""


class Order(Base, Workflow):
    """A business workflow: its rows are the application's, never pruned."""

    __tablename__ = "retention_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String, default="new")

    @step
    async def ship(self) -> None:
        self.status = "shipped"


# Every kind of table duly prunes: retention_attempts, _events, _outbox, _deliveries, _executions.
engine_tables = declare_engine_tables(Base, executions=True, prefix="retention_")
Outbox, Execution = engine_tables.outbox, engine_tables.execution


async def ship_order(event: WorkflowEvent) -> None:
    """A route that always succeeds."""


async def broken_route(event: WorkflowEvent) -> None:
    """A route that always fails: dead-lettered at once (no retries)."""
    raise ConnectionError("the carrier is down")


def refuse(given: Mapping[str, Any]) -> object:
    raise ValueError("refused")


# What `duly drain` and the drain function route with (infra.app_config finds it).
event_registry = DatabaseEventRegistry(
    outbox=Outbox, settings=EventSettings(mode="production", async_delivery=True, max_retries=0)
)
event_registry.register("order.placed", ship_order)
event_registry.register("order.flagged", ship_order)
event_registry.register("order.flagged", broken_route)  # processed, one route dead-lettered
event_registry.register("order.lost", broken_route)  # the row dead-lettered

DONE = WorkflowDefinition("retention.done", handler=lambda given: {"ok": True})
FAILING = WorkflowDefinition("retention.failing", handler=refuse)
PARKED = WorkflowDefinition("retention.parked", handler=lambda given: wait_for_resume())
executions = DurableWorkflowEngine(executions=Execution)
for definition in (DONE, FAILING, PARKED):
    executions.register(definition)


@pytest.fixture(autouse=True)
def routes() -> Iterator[None]:
    configure_event_registry(event_registry)
    yield
    configure_event_registry(None)


# -- what the tests start from --------------------------------------------------------------


async def populate(db: Database) -> Sessions:
    """Rows of every kind made by the engine, then some aged past the period (see OLD)."""
    Session = await db.create(Base.metadata)
    async with connect_workflows(Session):
        for n in range(1, 7):
            await Order(id=n).start(Order.ship)
        events = [WorkflowEvent("order.placed", "placed", {}, event_id=f"placed-{n}") for n in
                  range(1, 5)]  # fmt: skip
        events.append(WorkflowEvent("order.flagged", "flagged", {}, event_id="flagged-1"))
        events.append(WorkflowEvent("order.lost", "lost", {}, event_id="lost-1"))
        await event_registry.publish_many(events)
        started = [
            await executions.start(DONE, correlation_id="done-1"),
            await executions.start(DONE, correlation_id="done-2"),
            await executions.start(FAILING, correlation_id="failing-1"),
            await executions.start(PARKED, correlation_id="parked-1"),
            await executions.start(PARKED, correlation_id="parked-2"),
        ]
        await drain(Session)
        await executions.cancel(started[4].execution_id, reason="withdrawn")
    age(db, orders=(1, 2, 3), events=("placed-1", "placed-2", "flagged-1", "lost-1"),
        executions=("done-1", "failing-1", "parked-1", "parked-2"))  # fmt: skip
    return Session


# Past the period after populate(): 3 order attempts; 2 processed events (the flagged one
# has a dead-lettered route, the lost one is a dead letter), with a delivery and a record
# each; 3 executions (completed, failed, cancelled: the parked one is still waiting).
OLD = {
    "retention_attempts": 3,
    "retention_outbox": 2,
    "retention_deliveries": 2,
    "retention_events": 2,
    "retention_executions": 3,
    "duly_seen_signatures": 0,  # walked whenever the table exists: none expired here
    "duly_console_sessions": 0,  # likewise: no console session made here
}


def age(
    db: Database,
    *,
    orders: tuple[int, ...] = (),
    events: tuple[str, ...] = (),
    executions: tuple[str, ...] = (),
) -> None:
    """Move the timestamps of these rows back by AGE, as if they had been there that long."""
    db.sql(
        "UPDATE retention_attempts SET finished_at = finished_at - %s "
        "WHERE workflow = 'retention_orders' AND run_key = ANY(%s)",
        AGE,
        [str(n) for n in orders],
    )
    ids = list(events)
    db.sql("UPDATE retention_outbox SET created_at = created_at - %s, "
           "settled_at = settled_at - %s WHERE event_id = ANY(%s)", AGE, AGE, ids)  # fmt: skip
    db.sql("UPDATE retention_events SET created_at = created_at - %s WHERE event_id = ANY(%s)",
           AGE, ids)  # fmt: skip
    db.sql(
        "UPDATE retention_executions SET created_at = created_at - %s, "
        "finished_at = finished_at - %s WHERE correlation_id = ANY(%s)",
        AGE,
        AGE,
        list(executions),
    )


def contents(db: Database) -> dict[str, set[Any]]:
    """Every table's rows, by key."""
    return {
        "retention_orders": {r for (r,) in db.sql("SELECT id FROM retention_orders")},
        "retention_attempts": {r for (r,) in db.sql("SELECT id FROM retention_attempts")},
        "retention_outbox": {r for (r,) in db.sql("SELECT event_id FROM retention_outbox")},
        "retention_events": {r for (r,) in db.sql("SELECT event_id FROM retention_events")},
        "retention_deliveries": set(db.sql("SELECT event_id, handler FROM retention_deliveries")),
        "retention_executions": {
            r for (r,) in db.sql("SELECT correlation_id FROM retention_executions")
        },
    }


async def counted(Session: Sessions, settings: RetentionSettings | None = None) -> dict[str, int]:
    connection = await open_connection(Session)
    found = await count_prunable(connection, settings or RetentionSettings())
    assert not found.applied
    return {t.table: t.rows for t in found.tables}


# -- what is pruned --------------------------------------------------------------------------


async def test_the_dry_run_counts_exactly_the_rows_past_their_period(db: Database) -> None:
    Session = await populate(db)
    before = contents(db)
    assert await counted(Session) == OLD
    assert contents(db) == before, "a dry run deletes nothing"
    # The rows aged 40 days are past a period of 39 days, and nothing else is...
    assert await counted(Session, RetentionSettings().with_days(39)) == OLD
    # ...and none are past 41.
    assert set((await counted(Session, RetentionSettings().with_days(41))).values()) == {0}


async def test_prune_deletes_exactly_what_the_dry_run_counted_and_nothing_else(
    db: Database,
) -> None:
    Session = await populate(db)
    before = contents(db)
    aged = db.sql("SELECT id FROM retention_attempts WHERE workflow = 'retention_orders' "
                  "AND run_key IN ('1', '2', '3')")  # fmt: skip
    connection = await open_connection(Session)
    done = await prune(connection, RetentionSettings())
    assert done.applied and done.complete
    assert {t.table: t.rows for t in done.tables} == OLD
    after = contents(db)
    gone = {table: before[table] - after[table] for table in before}
    assert gone == {
        "retention_orders": set(),  # business rows, finished long ago: never pruned
        "retention_attempts": {r for (r,) in aged},
        "retention_outbox": {"placed-1", "placed-2"},
        "retention_events": {"placed-1", "placed-2"},
        "retention_deliveries": {
            ("placed-1", f"{__name__}.ship_order"),
            ("placed-2", f"{__name__}.ship_order"),
        },
        "retention_executions": {"done-1", "failing-1", "parked-2"},
    }
    assert all(after[table] <= before[table] for table in before), "nothing was added"
    # The dead letters stay, with their records and every delivery attempt.
    statuses = dict(db.sql("SELECT event_id, status FROM retention_outbox"))
    assert (statuses["flagged-1"], statuses["lost-1"]) == ("processed", "dead_letter")
    assert {"flagged-1", "lost-1"} <= after["retention_events"]
    assert await counted(Session) == dict.fromkeys(OLD, 0), "nothing left past its period"


async def test_the_cutoff_follows_the_database_clock(db: Database) -> None:
    Session = await db.create(Base.metadata)
    async with connect_workflows(Session):
        for n in range(1, 4):
            await Order(id=n).start(Order.ship)
        await drain(Session)
        assert (await counted(Session))["retention_attempts"] == 0
        await move_clock(Session, timedelta(days=31))
        for n in range(4, 6):  # finished at the moved clock's now: not old
            await Order(id=n).start(Order.ship)
        await drain(Session)
    assert (await counted(Session))["retention_attempts"] == 3
    done = await prune(await open_connection(Session), RetentionSettings())
    assert {t.table: t.rows for t in done.tables}["retention_attempts"] == 3
    assert db.sql("SELECT run_key FROM retention_attempts ORDER BY run_key") == [("4",), ("5",)]


async def test_a_kind_kept_for_good_is_not_pruned(db: Database) -> None:
    Session = await populate(db)
    settings = RetentionSettings(attempts_days=None, executions_days=None)
    found = await count_prunable(await open_connection(Session), settings)
    assert found.kept == ("attempts", "executions")
    assert {t.table for t in found.tables} == {
        "retention_outbox",
        "retention_deliveries",
        "retention_events",
        "duly_seen_signatures",
        "duly_console_sessions",
    }
    done = await prune(await open_connection(Session), settings)
    assert done.rows == 6
    assert db.sql("SELECT count(*) FROM retention_attempts WHERE finished_at < now() - "
                  "interval '30 days'") == [(3,)]  # fmt: skip


# -- batches ---------------------------------------------------------------------------------


def fill_attempts(db: Database, old: int, new: int, *, tie: int = 1) -> None:
    """`old` attempt rows finished 40 days ago or more (`tie` rows sharing each instant), and
    `new` ones finished now."""
    db.sql(
        "INSERT INTO retention_attempts "
        "(workflow, run_key, step, attempt, outcome, error, took_ms, finished_at) "
        "SELECT 'retention_orders', g::text, 'ship', 1, 'ok', NULL, 1.0, "
        "now() - %s - make_interval(secs => (%s - g) / %s) FROM generate_series(1, %s) AS g",
        AGE,
        old,
        tie,
        old,
    )
    db.sql(
        "INSERT INTO retention_attempts "
        "(workflow, run_key, step, attempt, outcome, error, took_ms, finished_at) "
        "SELECT 'retention_orders', 'new-' || g, 'ship', 1, 'ok', NULL, 1.0, now() "
        "FROM generate_series(1, %s) AS g",
        new,
    )
    db.sql("ANALYZE retention_attempts")


async def test_each_batch_is_a_transaction_of_its_own(db: Database) -> None:
    Session = await db.create(Base.metadata)
    # Seven rows share each instant, so batch edges (every 1,000 rows) fall inside ties.
    fill_attempts(db, 2_500, 10, tie=7)
    seen: list[tuple[int, int]] = []
    committed: list[float] = []
    reader = await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True)

    async def look(batch: Batch) -> None:
        committed.append(time.monotonic())
        # Another session, while the prune goes on: each committed batch is visible.
        if batch.table == "retention_attempts":
            cursor = await reader.execute("SELECT count(*) FROM retention_attempts")
            row = await cursor.fetchone()
            assert row is not None
            seen.append((batch.deleted, int(row[0])))

    try:
        connection = await open_connection(Session)
        settings = RetentionSettings(batch_size=1_000, pause_ms=200)
        done = await prune(connection, settings, on_batch=look)
    finally:
        await reader.close()
    # Three batches of the log, one look at each other walk (outbox, three execution states,
    # seen signatures, console sessions).
    assert (done.rows, done.batches, done.complete) == (2_500, 3 + 6, True)
    assert seen == [(1_000, 1_510), (1_000, 510), (500, 10)], "a transaction a batch"
    gaps = [later - earlier for earlier, later in pairwise(committed)]
    assert min(gaps[:3]) >= 0.2, "a pause after each batch that deleted rows"
    left = db.sql("SELECT run_key FROM retention_attempts ORDER BY run_key")
    assert left == sorted((f"new-{n}",) for n in range(1, 11))


async def test_max_batches_bounds_each_walk_so_every_table_moves_on(db: Database) -> None:
    Session = await populate(db)
    fill_attempts(db, 25, 0)
    settings = RetentionSettings(batch_size=10)
    connection = await open_connection(Session)
    first = await prune(connection, settings, max_batches=1)
    # One batch a walk: the attempt log's first ten, and all of the others' few.
    assert (first.batches, first.complete) == (7, False)
    assert {t.table: t.rows for t in first.tables} == {**OLD, "retention_attempts": 10}
    rest = await prune(connection, settings)
    assert (rest.batches, rest.complete) == (2 + 6, True)
    assert {t.table: t.rows for t in rest.tables}["retention_attempts"] == 25 + 3 - 10
    assert await counted(Session) == dict.fromkeys(OLD, 0)


async def test_a_batch_is_chosen_through_the_index_and_deleted_by_tid(db: Database) -> None:
    Session = await db.create(Base.metadata)
    fill_attempts(db, 20_000, 20_000)
    connection = await open_connection(Session)
    [scan] = [s for s in prune_scans(connection) if s.table.name == "retention_attempts"]
    statement = batch_statement(scan)
    engine: AsyncEngine = connection.engine
    async with engine.connect() as conn:
        compiled = statement.compile(dialect=conn.dialect)
        now = (await conn.exec_driver_sql("SELECT now()")).scalar_one()
        values = {
            "duly_cutoff": now - timedelta(days=30),
            "duly_after_at": BEGINNING,
            "duly_after_key": None,
            "duly_batch_size": 5_000,
        }
        params = compiled.construct_params(values)
        plan = (await conn.exec_driver_sql("EXPLAIN " + str(compiled), params)).scalars().all()
        await conn.rollback()
    text = "\n".join(plan)
    # The log is partitioned by day: rows this old are in its default partition, through
    # that partition's part of the finished index (tests/test_attempt_log_partitions.py).
    assert "retention_attempts_default_finished_at_id_idx" in text, text
    assert "Tid Scan on retention_attempts_default" in text, text
    assert "Seq Scan" not in text, text


# -- settings --------------------------------------------------------------------------------


def test_settings_default_to_thirty_days() -> None:
    settings = RetentionSettings.from_env({})
    assert settings == RetentionSettings()
    assert [settings.days_for(k) for k in ("attempts", "events", "executions")] == [30, 30, 30]
    assert (settings.batch_size, settings.pause_ms) == (5_000, 100)
    assert (settings.prune_on_drain, settings.drain_batches) == (False, 2)


def test_settings_read_the_environment() -> None:
    settings = RetentionSettings.from_env(
        {
            "DULY_RETAIN_ATTEMPTS_DAYS": "7",
            "DULY_RETAIN_EVENTS_DAYS": " Never ",
            "DULY_RETAIN_EXECUTIONS_DAYS": "365",
            "DULY_PRUNE_BATCH_SIZE": "1000",
            "DULY_PRUNE_PAUSE_MS": "0",
            "DULY_PRUNE_ON_DRAIN": "yes",
            "DULY_PRUNE_DRAIN_BATCHES": "3",
        }
    )
    tuned = {"batch_size": 1_000, "pause_ms": 0, "prune_on_drain": True, "drain_batches": 3}
    assert settings == RetentionSettings(7, None, 365, **tuned)
    assert settings.with_days(90) == RetentionSettings(90, 90, 90, **tuned)


def test_bad_settings_are_refused_naming_each_variable() -> None:
    with pytest.raises(ConfigurationError) as refused:
        RetentionSettings.from_env(
            {
                "DULY_RETAIN_ATTEMPTS_DAYS": "thirty",
                "DULY_RETAIN_EVENTS_DAYS": "0",
                "DULY_RETAIN_EXECUTIONS_DAYS": "-5",
                "DULY_PRUNE_BATCH_SIZE": "1e6",
                "DULY_PRUNE_PAUSE_MS": "-1",
                "DULY_PRUNE_ON_DRAIN": "sometimes",
                "DULY_PRUNE_DRAIN_BATCHES": "0",
            }
        )
    message = str(refused.value)
    for fragment in (
        "DULY_RETAIN_ATTEMPTS_DAYS must be a whole number or 'never', not 'thirty'",
        "DULY_RETAIN_EVENTS_DAYS must be from 1 to 36500, not 0",
        "DULY_RETAIN_EXECUTIONS_DAYS must be from 1 to 36500, not -5",
        "DULY_PRUNE_BATCH_SIZE must be a whole number, not '1e6'",
        "DULY_PRUNE_PAUSE_MS must be from 0 to 60000, not -1",
        "DULY_PRUNE_ON_DRAIN must be one of",
        "DULY_PRUNE_DRAIN_BATCHES must be at least 1, not 0",
    ):
        assert fragment in message, message
    with pytest.raises(ConfigurationError, match="attempts_days must be from 1 to 36500"):
        RetentionSettings(attempts_days=0)
    with pytest.raises(ConfigurationError, match="batch_size must be from 1 to 100000"):
        RetentionSettings(batch_size=1_000_000)


# -- duly prune ------------------------------------------------------------------------------


async def duly(*args: str) -> int:
    """`duly ARGS` through functions.cli.main, on a thread (it runs its own event loop)."""

    def run() -> int:
        try:
            cli.main(list(args))
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0

    return await asyncio.to_thread(run)


async def test_duly_prune_counts_then_deletes(
    db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await populate(db)
    before = contents(db)
    monkeypatch.setenv("DULY_APP", APP)
    monkeypatch.setenv("DULY_DATABASE_URL", db.url)

    assert await duly("prune") == 0
    out = capsys.readouterr().out
    assert out.startswith("duly prune: a dry run, nothing deleted.")
    lines = {line.split()[1]: line.split() for line in out.splitlines()[2:-1]}
    assert {table: int(line[2]) for table, line in lines.items()} == OLD
    assert lines["retention_attempts"][0] == "attempts"
    assert "(30 days)" in out and "duly prune --apply deletes them" in out

    assert await duly("prune", "--json", "--older-than-days", "41") == 0
    none = json.loads(capsys.readouterr().out)
    assert (none["applied"], none["rows"]) == (False, 0)
    # 0: the seen signatures; 1: the console's sessions, a day after they expire.
    assert {t["days"] for t in none["tables"]} == {41, 0, 1}
    assert contents(db) == before

    assert await duly("prune", "--apply", "--json") == 0
    done = json.loads(capsys.readouterr().out)
    # A batch for each walk: the log, the outbox, three execution states, the signatures,
    # the sessions.
    assert (done["applied"], done["complete"], done["batches"]) == (True, True, 7)
    assert {t["table"]: t["rows"] for t in done["tables"]} == OLD
    assert done["rows"] == sum(OLD.values())
    after = contents(db)
    assert after["retention_orders"] == before["retention_orders"]
    assert len(before["retention_attempts"]) - len(after["retention_attempts"]) == 3

    assert await duly("prune", "--apply") == 0
    assert capsys.readouterr().out.startswith("duly prune: deleted 0 rows in 7 transactions")

    assert await duly("prune", "--older-than-days", "0") == 2
    assert "must be from 1 to 36500, not 0" in capsys.readouterr().err
    monkeypatch.setenv("DULY_RETAIN_EVENTS_DAYS", "soon")
    assert await duly("prune") == 2
    assert "DULY_RETAIN_EVENTS_DAYS must be a whole number" in capsys.readouterr().err


# -- the drain function's pass ---------------------------------------------------------------


class QuietScheduler:
    """The runtime's scheduler, doing nothing (the drain kicks a wake for what it routed)."""

    async def on_idle(self, at: object) -> None:
        return None

    async def kick(self) -> None:
        return None


def runtime(db: Database, retention: RetentionSettings) -> Runtime:
    settings = AwsSettings(
        database_url=db.url,
        database_secret_arn=None,
        wake_function_arn="arn:aws:lambda:us-east-1:123456789012:function:wake",
        schedule_group="retention",
        scheduler_role_arn="arn:aws:iam::123456789012:role/scheduler",
        app_module=APP,
    )
    return Runtime(settings, scheduler=lambda rt, engine: QuietScheduler(), retention=retention)


async def drain_once(rt: Runtime) -> dict[str, Any]:
    budget = Budget(30.0, 2.0, time.monotonic())
    return await lambda_work.drain(rt, {"duly": "drain"}, budget)


async def test_the_drain_prunes_a_bounded_pass_when_asked(db: Database) -> None:
    Session = await db.create(Base.metadata)
    fill_attempts(db, 2_500, 5)
    async with connect_workflows(Session):
        await event_registry.publish_many([WorkflowEvent("order.placed", "placed", {})])

    plain = runtime(db, RetentionSettings(batch_size=1_000))
    try:
        result = await drain_once(plain)
    finally:
        await (await plain.container()).engine.dispose()
    assert result == {"routed": 1, "caught_up": True, "kicked": False}
    assert db.sql("SELECT count(*) FROM retention_attempts") == [(2_505,)]

    asked = RetentionSettings(batch_size=1_000, prune_on_drain=True, drain_batches=2)
    pruning = runtime(db, asked)
    try:
        first = await drain_once(pruning)
        second = await drain_once(pruning)
    finally:
        await (await pruning.container()).engine.dispose()
    # Two batches of the log at most, one look at each other walk (outbox, execution states,
    # seen signatures, console sessions).
    assert first["pruned"] == {"rows": 2_000, "batches": 2 + 6, "complete": False}
    assert second["pruned"] == {"rows": 500, "batches": 1 + 6, "complete": True}
    assert db.sql("SELECT count(*) FROM retention_attempts") == [(5,)]
    async with Session() as session:
        assert (await session.execute(select(Outbox.status))).scalars().all() == ["processed"]
