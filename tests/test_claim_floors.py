"""Claims read the due index from a floor, so a held xmin horizon does not make them slow.

While one transaction holds vacuum back, every version a claim or a commit
replaced keeps its entry in the due index, ahead of the live rows. The tests
make those entries (the rows moved on twenty times under a held snapshot),
then compare what a claim from the index's first entry and a floored claim
read, and show that no row is ever left below a floor: the probe, a caught-up
pass that someone waits for, and the test clock's news all reach it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.claims.claim import claim_due
from engine.claims.floors import FLOOR_HORIZON, FLOOR_MARGIN, PROBE_NEAR, DueFloors
from engine.claims.next_due import NextDue, next_due
from engine.model.registry import workflow_info
from engine.worker import floor_keeper
from engine.worker.floor_keeper import FloorKeeper
from engine.worker.running import run_workflows
from tests.apps import behaviour
from tests.apps.behaviour import Timer
from tests.conftest import Database
from tests.query_plans import analyzed, nodes, plan_of, sent, the_one

LEASE = timedelta(minutes=5)
ROWS = 2_000
MOVES = 20  # versions each row leaves behind while the horizon is held


@contextmanager
def held_horizon(db: Database) -> Iterator[None]:
    """One session idle in a transaction that has an XID: vacuum can remove nothing newer."""
    with psycopg.connect(db.conninfo) as holder:
        holder.execute("SELECT txid_current()")
        yield
        holder.rollback()


def fill_due(db: Database, rows: int) -> None:
    db.sql(
        "INSERT INTO timer (fired, next_step, next_args, wake_at) "
        "SELECT 0, 'fire', '{}'::json, now() - interval '1 hour' FROM generate_series(1, %s)",
        rows,
    )


async def filled_timers(db: Database) -> AsyncEngine:
    """The timer table with ROWS rows due an hour ago, analyzed; its engine."""
    Session = await db.create(behaviour.Base.metadata)
    fill_due(db, ROWS)
    return analyzed(db, Session, "timer")


def move_on(db: Database, times: int) -> None:
    """Each due row rescheduled `times` times, later each time, as claims and commits do.

    Within a move the instants are scattered, as a worker's are: the index's order is
    not the heap's, so each entry visited is a buffer touched.
    """
    for move in range(1, times + 1):
        db.sql(
            "UPDATE timer SET wake_at = now() - interval '1 hour' + %s * interval '1 minute' "
            "+ random() * interval '30 seconds' WHERE next_step IS NOT NULL",
            move,
        )


def buffers(plan: dict[str, Any]) -> int:
    """Shared buffers the plan's scans of `timer` touched (hit or read)."""
    return sum(
        node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        for node in nodes(plan)
        if node.get("Relation Name") == "timer" and node["Node Type"] != "ModifyTable"
    )


async def claim_buffers(engine: AsyncEngine, floor: Any) -> tuple[int, list[int]]:
    """What one claim of 8 rows reads, and the ids it takes (rolled back)."""
    with sent(engine) as seen:
        async with engine.connect() as conn:
            rows = await claim_due(conn, workflow_info(Timer), 8, LEASE, floor=floor)
            await conn.rollback()
    statement, parameters = the_one(seen, "SKIP LOCKED")
    plan = await plan_of(engine, (statement, parameters), analyze=True, buffers=True)
    return buffers(plan), sorted(row.id for row in rows)


async def test_a_floored_claim_reads_what_is_due_not_what_claims_left_behind(
    db: Database,
) -> None:
    engine = await filled_timers(db)
    with held_horizon(db):
        move_on(db, MOVES)
        (earliest,) = db.sql("SELECT min(wake_at) FROM timer WHERE next_step IS NOT NULL")[0]
        from_start, taken = await claim_buffers(engine, None)
        floored, taken_floored = await claim_buffers(engine, earliest - FLOOR_MARGIN)
    # From the first entry the claim visits each of the 40,000 versions left behind.
    assert from_start > 20 * floored, (from_start, floored)
    assert taken_floored == taken  # the same rows, oldest first


async def next_due_buffers(
    engine: AsyncEngine, floor: Any, looking_again: bool
) -> tuple[int, NextDue | None]:
    """What one floored next-due question reads, and its answer."""
    with sent(engine) as seen:
        async with engine.connect() as conn:
            upcoming = await next_due(
                conn, [workflow_info(Timer)], floors=[floor], looking_again=looking_again
            )
    plan = await plan_of(engine, the_one(seen, "min("), analyze=True, buffers=True)
    return buffers(plan), upcoming


async def test_a_worker_looking_again_reads_no_lease_ends_past_the_horizon(
    db: Database,
) -> None:
    engine = await filled_timers(db)
    (now,) = db.sql("SELECT now()")[0]
    with held_horizon(db):
        # Claimed again and again (each lease's end within the next 30 s), then finished: the
        # lease ends stay in the index, ahead of the one step still running.
        for _ in range(MOVES):
            db.sql("UPDATE timer SET wake_at = now() + random() * interval '30 seconds'")
        db.sql("UPDATE timer SET wake_at = now() + interval '40 seconds' WHERE id = 1")
        db.sql("UPDATE timer SET next_step = NULL, wake_at = NULL WHERE id <> 1")
        floor = now - FLOOR_MARGIN
        whole, exact = await next_due_buffers(engine, floor, looking_again=False)
        bounded, again = await next_due_buffers(engine, floor, looking_again=True)
        db.sql("UPDATE timer SET wake_at = now() + interval '300 ms' WHERE id = 1")
        _, soon = await next_due_buffers(engine, floor, looking_again=True)
    assert exact is not None and 39 < exact.seconds <= 40  # the running step's lease
    # Nothing within the horizon: its end is the answer, the instant to look again.
    assert again is not None and 0 < again.seconds <= FLOOR_HORIZON.total_seconds()
    assert soon is not None and 0 < soon.seconds <= 0.3  # a row within it is the answer
    # The whole question visits every lease end left behind; the bounded one a thirtieth.
    assert whole > 10 * bounded, (whole, bounded)


def claimed(*scheduled: Any) -> list[SimpleNamespace]:
    return [SimpleNamespace(duly_scheduled_at=at) for at in scheduled]


def test_a_floor_rises_with_what_claims_take_and_falls_to_what_a_probe_finds() -> None:
    from datetime import UTC, datetime

    start = datetime(2026, 12, 1, tzinfo=UTC)
    floors = DueFloors()
    assert not floors and floors.floor("timer") is None
    floors.after_claim("timer", [])
    assert floors.floor("timer") is None  # nothing taken: nothing learnt
    floors.after_claim("timer", claimed(start + timedelta(seconds=5), start + timedelta(seconds=3)))
    assert floors.floor("timer") == start + timedelta(seconds=3) - FLOOR_MARGIN
    floors.after_claim("timer", claimed(start + timedelta(seconds=2)))  # never moves down
    assert floors.floor("timer") == start + timedelta(seconds=3) - FLOOR_MARGIN
    floors.lower("timer", start)
    assert floors.floor("timer") == start - FLOOR_MARGIN
    floors.lower("other", start)
    assert floors.floor("other") is None  # no floor: claims read from the start already
    floors.forget()
    assert floors.floor("timer") is None


async def wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def fired(db: Database, row_id: int) -> bool:
    return bool(db.sql("SELECT fired FROM timer WHERE id = %s", row_id)[0][0])


async def test_a_row_written_due_below_a_floor_is_found_by_the_probe(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]) as worker:
        stop = asyncio.Event()

        async def trickle() -> None:  # the worker keeps claiming, so it keeps its floor
            while not stop.is_set():
                db.sql(
                    "INSERT INTO timer (fired, next_step, next_args, wake_at) "
                    "VALUES (0, 'fire', '{}'::json, now())"
                )
                db.sql("NOTIFY duly, 'timer'")
                await asyncio.sleep(0.05)

        feeding = asyncio.create_task(trickle())
        try:
            await wait_for(lambda: worker._floors.floor("timer") is not None)
            # A writer that began long ago commits a row due before the floor, unannounced.
            (late,) = db.sql(
                "INSERT INTO timer (fired, next_step, next_args, wake_at) "
                "VALUES (0, 'fire', '{}'::json, now() - interval '1 minute') RETURNING id"
            )[0]
            probes = worker._floor_keeper.probes
            await wait_for(lambda: fired(db, late))
            assert worker._floor_keeper.probes > probes  # the probe, not a claim, found it
        finally:
            stop.set()
            await feeding


async def test_the_probe_reads_near_its_floors_each_time_and_all_below_as_its_cost_allows(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(floor_keeper, "DEEP_SHARE", 1e-9)  # any whole read is slow enough
    Session = await db.create(behaviour.Base.metadata)
    (now,) = db.sql("SELECT now()")[0]
    near, far = now - PROBE_NEAR / 2, now - timedelta(minutes=1)
    for at in (near, far):
        db.sql(
            "INSERT INTO timer (fired, next_step, next_args, wake_at) "
            "VALUES (0, 'fire', '{}'::json, %s)",
            at,
        )
    floors = DueFloors()
    floors.after_claim("timer", claimed(now + FLOOR_MARGIN))  # the floor is `now`
    kicks: list[None] = []
    keeper = FloorKeeper(
        analyzed(db, Session, "timer"),
        floors,
        lambda: [(workflow_info(Timer), None)],
        lambda: kicks.append(None),
    )
    await keeper.probe(deep=False)  # the probe of every second sees only the near row
    assert floors.floor("timer") == near - FLOOR_MARGIN and len(kicks) == 1
    await keeper.probe(deep=True)
    assert floors.floor("timer") == far - FLOOR_MARGIN and len(kicks) == 2
    # That whole read "took" a billion times its share: the next one is far off, while
    # the near probes go on every PROBE_EVERY.
    assert keeper._deep_at > time.monotonic() + 3600
    assert keeper.interval == floor_keeper.PROBE_EVERY


async def test_run_until_idle_is_sure_nothing_lies_below_its_floor(db: Database) -> None:
    from engine.model.connection import activate, open_connection
    from engine.worker.loop import Worker
    from engine.worker.options import WorkerOptions

    Session = await db.create(behaviour.Base.metadata)
    fill_due(db, 3)  # due an hour ago: below the floor the worker is given
    connection = await open_connection(Session, [Timer])
    worker = Worker(connection, WorkerOptions(listen=False))
    (now,) = db.sql("SELECT now()")[0]
    worker._floors.after_claim("timer", claimed(now))
    async with activate(connection):
        assert await worker.run_until_idle() == 3
    assert worker._floors.floor("timer") is None  # its caught-up pass read from the start


async def test_the_test_clock_moving_forgets_the_floors(db: Database) -> None:
    from engine.base.notify import EVERYONE

    Session = await db.create(behaviour.Base.metadata)
    fill_due(db, 5)
    async with run_workflows(Session, workflows=[Timer]) as worker:
        await wait_for(lambda: worker._floors.floor("timer") is not None)
        worker.kick(EVERYONE)
        assert worker._floors.floor("timer") is None


@pytest.mark.parametrize("answer_awaited", [True, False])
async def test_a_caught_up_pass_reads_from_the_start_only_when_someone_waits_for_it(
    db: Database, answer_awaited: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(floor_keeper, "PROBE_EVERY", 60.0)  # no probe forgets the floor meanwhile
    Session = await db.create(behaviour.Base.metadata)
    fill_due(db, 5)
    told: list[Any] = []
    on_idle = told.append if answer_awaited else None
    async with run_workflows(Session, workflows=[Timer], on_idle=on_idle) as worker:
        assert worker.listener is not None
        await asyncio.wait_for(worker.listener.connected.wait(), 10)  # its catch-up kick is past
        await wait_for(lambda: db.sql("SELECT count(*) FROM timer WHERE fired = 1")[0][0] == 5)
        await wait_for(lambda: not worker._claims)
        (now,) = db.sql("SELECT now()")[0]
        worker._floors.after_claim("timer", claimed(now))
        passes = worker.passes
        worker.kick("timer")
        await wait_for(lambda: worker.passes > passes)
        worker.kick("timer")  # a second pass begins once the first has ended
        await wait_for(lambda: worker.passes > passes + 1)
        # With on_idle to tell, the caught-up pass dropped its floor; without, it kept it.
        assert (worker._floors.floor("timer") is None) is answer_awaited
