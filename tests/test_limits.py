"""Limits in one process: at_most per group, the rate's token bucket, and bad declarations.

Three worker processes sharing one limit are in tests/processes/test_limits_processes.py.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import String, func, inspect, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import ConfigurationError, Limit, Workflow, connect_workflows, run_workflows, step
from engine.base.clock import db_now
from engine.testing import drain, move_clock
from tests.apps import limited
from tests.apps.limited import (
    AT_MOST,
    RATE,
    Charge,
    LimitAttempt,
    Lookup,
    Render,
    Shipment,
    WorkflowRate,
)
from tests.conftest import Database
from tests.helpers import is_burst, wait_until

# -- declarations -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"by": "customer"}, "needs at_most, rate, or both"),
        ({"by": "", "at_most": 3}, "must name a column"),
        ({"by": "customer", "at_most": 0}, "at_most must be a whole number >= 1"),
        ({"by": "customer", "at_most": 2.5}, "at_most must be a whole number >= 1"),
        ({"by": "customer", "rate": 60}, "needs per="),
        ({"by": "customer", "rate": 60, "per": timedelta(0)}, "needs per="),
        ({"by": "customer", "rate": 0.5, "per": timedelta(minutes=1)}, "at least 1 per period"),
        ({"by": "customer", "rate": "60", "per": timedelta(minutes=1)}, "must be a number"),
        ({"by": "customer", "at_most": 3, "per": timedelta(minutes=1)}, "per= means nothing"),
    ],
)
def test_a_limit_that_cannot_work_is_refused_where_it_is_written(
    arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Limit(**arguments)


def test_a_limit_must_name_a_not_null_column_of_its_table() -> None:
    class Base(DeclarativeBase):
        pass

    with pytest.raises(ConfigurationError, match="'tenant', which is not a column of nowhere"):

        class Nowhere(Base, Workflow):
            __tablename__ = "nowhere"
            __workflow_limit__ = Limit(by="tenant", at_most=1)
            id: Mapped[int] = mapped_column(primary_key=True)

    with pytest.raises(ConfigurationError, match="'tenant', which must be NOT NULL"):

        class Loose(Base, Workflow):
            __tablename__ = "loose"
            __workflow_limit__ = Limit(by="tenant", at_most=1)
            id: Mapped[int] = mapped_column(primary_key=True)
            tenant: Mapped[str | None] = mapped_column(String)

            @step
            async def go(self) -> None:
                pass


def test_a_limited_table_gets_the_indexes_its_passes_use() -> None:
    indexes = {index.name: index for index in Lookup.__table__.indexes}
    waiting = indexes["ix_lookup_due_by_customer"]
    running = indexes["ix_lookup_running_by_customer"]
    assert [c.name for c in waiting.columns] == ["customer", "wake_at"]
    assert [c.name for c in running.columns] == ["customer"]
    assert str(running.dialect_options["postgresql"]["where"]) == "lookup.claimed_until IS NOT NULL"


def test_both_spellings_of_rate_bucket_declare_the_same_columns() -> None:
    def columns(model: type) -> dict[str, tuple[str, bool, bool]]:
        return {
            c.name: (str(c.type), bool(c.nullable), c.primary_key)
            for c in inspect(model).local_table.c
        }

    assert columns(limited.DataRate) == columns(WorkflowRate)
    assert limited.DataRate.__init__.__code__.co_argcount == 1  # nothing to pass: engine rows


async def test_a_rate_limit_without_a_bucket_table_is_refused_before_claiming(
    db: Database,
) -> None:
    Session = await db.create(limited.Base.metadata)
    db.sql("DROP TABLE workflow_rate")
    with pytest.raises(ConfigurationError, match="Charge has a rate limit, but no RateBucket"):
        await drain(Session, [Charge])
    # A process that only starts runs needs no bucket.
    async with connect_workflows(Session, workflows=[Charge]):
        assert await Charge(provider="p").start(Charge.charge)


# -- at_most ------------------------------------------------------------------------


async def _leased_per_customer(Session: Any) -> dict[str, int]:
    async with Session() as session:
        rows = await session.execute(
            select(Lookup.customer, func.count())
            .where(Lookup.claimed_until.isnot(None))
            .group_by(Lookup.customer)
        )
        return {customer: count for customer, count in rows.all()}


async def test_a_group_at_its_limit_is_skipped_and_the_pass_goes_to_the_others(
    db: Database,
) -> None:
    Session = await db.create(limited.Base.metadata)
    async with connect_workflows(Session, workflows=[Lookup]):
        for _ in range(20):  # the big customer's rows are the longest waiting
            assert await Lookup(customer="big").start(Lookup.work(0.6))
        for customer in ("small-1", "small-2"):
            assert await Lookup(customer=customer).start(Lookup.work(0.6))
    async with run_workflows(Session, workflows=[Lookup], max_concurrency=8):
        # While the first five run (0.6 s each): three of the big customer's, and the others.
        expected = {"big": AT_MOST, "small-1": 1, "small-2": 1}
        await wait_until(lambda: _leased_is(Session, expected), timeout=5)

        await wait_until(lambda: _all_finished(Session, Lookup), timeout=15)
    async with Session() as session:
        ended = (await session.scalars(select(Lookup.ended))).all()
    assert len(ended) == 22 and None not in ended, "every lookup ran to its end"
    assert await _leased_per_customer(Session) == {}, "nothing is left leased"


async def _leased_is(Session: Any, expected: dict[str, int]) -> bool:
    leased = await _leased_per_customer(Session)
    assert all(count <= AT_MOST for count in leased.values()), leased
    return leased == expected


async def test_the_longest_waiting_group_is_claimed_first(db: Database) -> None:
    Session = await db.create(limited.Base.metadata)
    async with connect_workflows(Session, workflows=[Lookup]):
        for customer in ("c", "a", "b"):  # started in this order: c waits longest
            assert await Lookup(customer=customer).start(Lookup.work(0))
    async with run_workflows(Session, workflows=[Lookup], max_concurrency=1):
        await wait_until(lambda: _all_finished(Session, Lookup))
    async with Session() as session:
        order = (await session.scalars(select(Lookup.customer).order_by(Lookup.started))).all()
    assert order == ["c", "a", "b"]


async def _all_finished(Session: Any, model: Any) -> bool:
    """No run of `model` has a step scheduled."""
    async with Session() as session:
        left = await session.scalar(
            select(func.count()).select_from(model).where(model.next_step.isnot(None))
        )
        return left == 0


# -- rate ---------------------------------------------------------------------------


async def _start_charges(Session: Any, count: int, target: Any = Charge.charge) -> None:
    async with connect_workflows(Session, workflows=[Charge]):
        for _ in range(count):
            assert await Charge(provider="acme").start(target)


async def test_a_rate_starts_one_periods_burst_then_no_more_than_it_refills(
    db: Database,
) -> None:
    Session = await db.create(limited.Base.metadata)
    runs = 300
    await _start_charges(Session, runs)
    tick = timedelta(seconds=5)
    started = [await drain(Session, [Charge])]
    # A quiet provider may start a period's worth at once, and then must wait.
    assert is_burst(started[0])
    assert await drain(Session, [Charge]) <= 1  # spent: what real time refilled meanwhile
    moved = timedelta(0)
    while sum(started) < runs and moved < timedelta(minutes=6):
        await move_clock(Session, tick)
        moved += tick
        started.append(await drain(Session, [Charge]))
    assert sum(started) == runs
    # Judged on the database clock, which the bucket refills by: the moved clock plus the
    # real time the test itself took.
    async with Session() as session:
        times = (
            await session.scalars(
                select(LimitAttempt.finished_at).order_by(LimitAttempt.finished_at)
            )
        ).all()
    assert len(times) == runs
    # 60 a minute after the burst: the last of 240 more starts four minutes after the first.
    assert timedelta(minutes=4) - 2 * tick <= times[-1] - times[0] <= timedelta(minutes=4) + tick
    # Every window of one period holds at most the burst plus one period's refill.
    busiest = max(
        sum(1 for later in times[i:] if later - first < limited.PERIOD)
        for i, first in enumerate(times)
    )
    assert busiest <= 2 * RATE + 2
    after_burst = times[RATE:]
    steady = max(
        sum(1 for later in after_burst[i:] if later - first < limited.PERIOD)
        for i, first in enumerate(after_burst)
    )
    assert steady <= RATE + 2, "after the burst, no minute starts more than the rate"


async def test_every_start_spends_a_token_even_a_step_that_follows_at_once(
    db: Database,
) -> None:
    Session = await db.create(limited.Base.metadata)
    await _start_charges(Session, 40, Charge.charge_twice)
    # 40 runs of two steps each: the burst covers 60 starts, not 40 runs.
    started = await drain(Session, [Charge])
    assert is_burst(started)
    async with Session() as session:
        charged = await session.scalar(select(func.sum(Charge.charged)))
    assert charged == started


async def test_truncating_the_bucket_table_only_starts_every_limit_full_again(
    db: Database,
) -> None:
    Session = await db.create(limited.Base.metadata)
    await _start_charges(Session, 150)
    assert is_burst(await drain(Session, [Charge]))
    assert await drain(Session, [Charge]) <= 1  # spent: what real time refilled meanwhile
    db.sql("TRUNCATE workflow_rate")
    assert is_burst(await drain(Session, [Charge]))


async def test_each_group_has_a_bucket_of_its_own(db: Database) -> None:
    Session = await db.create(limited.Base.metadata)
    async with connect_workflows(Session, workflows=[Charge]):
        for provider in ("acme", "globex"):
            for _ in range(RATE + 10):
                assert await Charge(provider=provider).start(Charge.charge)
    assert is_burst(await drain(Session, [Charge]), buckets=2)
    async with Session() as session:
        buckets = (await session.scalars(select(WorkflowRate.group_key))).all()
        assert sorted(buckets) == ["acme", "globex"]
        # A bucket the clock cannot refill past one period's worth.
        await session.execute(update(WorkflowRate).values(tokens=0))
        await session.commit()
    await move_clock(Session, timedelta(hours=5))
    assert await drain(Session, [Charge]) == 2 * 10


# -- limits and lanes ---------------------------------------------------------------


async def test_a_limit_counts_across_lanes_and_each_worker_claims_only_its_own(
    db: Database,
) -> None:
    """The default worker prepares every run; the media worker renders one per customer at once."""
    Session = await db.create(limited.Base.metadata)
    async with connect_workflows(Session, workflows=[Render]):
        for customer in ("a", "a", "a", "b", "b"):
            assert await Render(customer=customer).start(Render.prepare)
    assert await drain(Session, [Render]) == 5  # one per customer at a time: both go in turn
    async with Session() as session:
        waiting = await session.scalars(select(Render.next_step))
        assert set(waiting.all()) == {"render"}, "the default worker ran no media step"
    async with run_workflows(Session, workflows=[Render], lanes=["media"], max_concurrency=8):
        await wait_until(lambda: _all_finished(Session, Render), timeout=10)
    async with Session() as session:
        spans = (await session.execute(select(Render.customer, Render.started, Render.ended))).all()
    for customer in ("a", "b"):
        mine = sorted((s, e) for c, s, e in spans if c == customer)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(mine))


# -- what an idle worker reports when a limit holds due work back ------------------------


async def _database_now(Session: Any) -> Any:
    async with Session() as session:
        return await session.scalar(select(db_now()))


async def test_a_bucket_short_of_a_token_reports_when_it_will_hold_one(db: Database) -> None:
    """Not the held rows' own (past) due time: a platform woken then would find nothing."""
    Session = await db.create(limited.Base.metadata)
    await _start_charges(Session, RATE + 10)
    assert is_burst(await drain(Session, [Charge]))
    told: list[Any] = []
    async with run_workflows(
        Session, workflows=[Charge], suspends_when_idle=True, on_idle=told.append
    ) as worker:
        assert await worker.wake(5)
        now = await _database_now(Session)
    # One token a second: the next start is at most a second away, and not yet.
    assert told and now < told[-1] <= now + timedelta(seconds=1.1)


async def test_a_listening_worker_starts_rate_held_work_as_tokens_come(db: Database) -> None:
    Session = await db.create(limited.Base.metadata)
    await _start_charges(Session, RATE + 10)
    burst = await drain(Session, [Charge])
    assert is_burst(burst)

    async def charged() -> int:
        async with Session() as session:
            return int(await session.scalar(select(func.sum(Charge.charged))) or 0)

    async def two_more() -> bool:
        return await charged() - burst >= 2

    began = time.monotonic()
    async with run_workflows(Session, workflows=[Charge], poll_interval=timedelta(seconds=5)):
        await wait_until(two_more, timeout=10)
        took = time.monotonic() - began
    # Woken by the bucket's own instant, a token a second: the 5 s poll had not come round.
    assert took < 4.5, f"two starts as tokens came took {took:.2f} s"
    assert 2 <= await charged() - burst <= 4


async def test_a_group_at_its_limit_reports_the_end_of_the_running_leases(db: Database) -> None:
    Session = await db.create(limited.Base.metadata)
    async with connect_workflows(Session, workflows=[Lookup]):
        for _ in range(AT_MOST + 2):
            assert await Lookup(customer="big").start(Lookup.work(3))
    lease = timedelta(minutes=5)
    async with run_workflows(Session, workflows=[Lookup], lease=lease):
        await wait_until(lambda: _leased(Session, AT_MOST))
        told: list[Any] = []
        async with run_workflows(
            Session, workflows=[Lookup], suspends_when_idle=True, on_idle=told.append
        ) as second:
            # Nothing it may take: caught up, though two runs are due.
            assert await second.wake(5)
            now = await _database_now(Session)
        assert told and told[-1] > now + lease - timedelta(seconds=10)


async def _leased(Session: Any, count: int) -> bool:
    return await _leased_per_customer(Session) == {"big": count}


async def test_a_limit_works_on_a_table_keyed_by_two_columns_and_grouped_by_a_number(
    db: Database,
) -> None:
    Session = await db.create(limited.Base.metadata)
    async with connect_workflows(Session, workflows=[Shipment]):
        for order_id in range(4):
            for line in range(3):
                shipment = Shipment(order_id=order_id, line=line, warehouse=order_id % 2)
                assert await shipment.start(Shipment.ship)
    # Five tokens a warehouse: ten of the twelve start now, one more per warehouse once
    # the clock has moved a fifth of a minute (real time refills too slowly to matter).
    assert await drain(Session, [Shipment]) == 10
    await move_clock(Session, timedelta(seconds=12))
    assert await drain(Session, [Shipment]) == 2
    async with Session() as session:
        shipped = await session.scalar(select(func.count()).where(Shipment.shipped))
    assert shipped == 12
