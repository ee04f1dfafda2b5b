"""A limit holds across worker processes, and a big group does not hold up the small ones."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from tests.apps import limited
from tests.apps.limited import AT_MOST, Burst, LimitAttempt, Lookup
from tests.conftest import Database
from tests.helpers import wait_until
from tests.processes.conftest import WorkerProcesses

BIG_RUNS = 10_000
SMALL_CUSTOMERS = 10
STEP_SECONDS = 0.05


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of `spans` (start, end) open at one instant."""
    # At one instant an end closes before a start opens: touching spans did not overlap.
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def test_most_at_once_counts_overlaps() -> None:
    assert most_at_once([(0, 1), (1, 2), (0.5, 1.5)]) == 2
    assert most_at_once([(0, 3), (1, 2), (1.5, 2.5)]) == 3


async def test_three_workers_keep_a_customer_to_three_and_serve_small_customers_first(
    db: Database, workers: WorkerProcesses
) -> None:
    Session = await db.create(limited.Base.metadata)
    arguments = json.dumps(Lookup.work(STEP_SECONDS).encoded)
    # The big customer imported its ten thousand first: every one of them waits longer.
    db.sql(
        "INSERT INTO lookup (customer, next_step, next_args, wake_at) "
        "SELECT 'big', 'work', %s::jsonb, now() - make_interval(secs => (%s - g) / 1000.0) "
        "FROM generate_series(1, %s) AS g",
        arguments,
        BIG_RUNS + 1,
        BIG_RUNS,
    )
    db.sql(
        "INSERT INTO lookup (customer, next_step, next_args, wake_at) "
        "SELECT 'small-' || c, 'work', %s::jsonb, now() "
        "FROM generate_series(1, %s) AS c, generate_series(1, 2)",
        arguments,
        SMALL_CUSTOMERS,
    )
    began = time.monotonic()
    for _ in range(3):
        workers.start(db.url, "--workflows", "lookup", "--concurrency", "8")

    async def small_ones_left() -> int:
        async with Session() as session:
            left = await session.scalar(
                select(func.count())
                .select_from(Lookup)
                .where(Lookup.customer != "big", Lookup.next_step.isnot(None))
            )
            return int(left or 0)

    while await small_ones_left():
        assert time.monotonic() - began < 15, "the small customers waited behind the big one"
        await asyncio.sleep(0.05)
    small_done_after = time.monotonic() - began
    big_left = await _big_left(Session)
    assert big_left > BIG_RUNS * 0.9, "the small customers finished only after most of the big"
    # Let the big customer run on for a while, so its three slots are busy throughout.
    while BIG_RUNS - await _big_left(Session) < 150:
        assert time.monotonic() - began < 60
        await asyncio.sleep(0.1)
    for process in list(workers.started):
        assert workers.stop(process) == 0
    async with Session() as session:
        finished = (
            await session.execute(
                select(Lookup.customer, Lookup.started, Lookup.ended).where(
                    Lookup.ended.isnot(None)
                )
            )
        ).all()
    spans: dict[str, list[tuple[float, float]]] = {}
    for customer, started, ended in finished:
        spans.setdefault(customer, []).append((started, ended))
    peaks = {customer: most_at_once(s) for customer, s in spans.items()}
    print(f"small customers done after {small_done_after:.2f} s; peaks {peaks}")
    assert len(spans) == SMALL_CUSTOMERS + 1
    assert max(peaks.values()) <= AT_MOST
    assert peaks["big"] == AT_MOST, "the big customer kept its three slots busy"


async def _big_left(Session: Any) -> int:
    async with Session() as session:
        left = await session.scalar(
            select(func.count())
            .select_from(Lookup)
            .where(Lookup.customer == "big", Lookup.next_step.isnot(None))
        )
        return int(left or 0)


async def test_three_workers_share_one_bucket(db: Database, workers: WorkerProcesses) -> None:
    """20 starts a second across all workers, after a burst of 20: counted in the database."""
    Session = await db.create(limited.Base.metadata)
    arguments = json.dumps(Burst.go().encoded)
    db.sql(
        "INSERT INTO burst (provider, next_step, next_args, wake_at) "
        "SELECT 'acme', 'go', %s::jsonb, now() FROM generate_series(1, 400)",
        arguments,
    )
    for _ in range(3):
        workers.start(db.url, "--workflows", "burst", "--concurrency", "8")

    async def started_for_a_while() -> bool:  # the burst (20), then three seconds of 20 a second
        async with Session() as session:
            return int(await session.scalar(select(func.count()).select_from(LimitAttempt))) >= 80

    await wait_until(started_for_a_while, timeout=20)
    for process in list(workers.started):
        assert workers.stop(process) == 0
    async with Session() as session:
        times = sorted((await session.scalars(select(LimitAttempt.finished_at))).all())
    rate = 20
    elapsed = (times[-1] - times[0]).total_seconds()
    # The bucket starts full (20) and gains 20 a second, whichever worker spends it.
    assert len(times) <= rate + rate * elapsed + 2  # + a commit's lag behind its claim
    assert len(times) >= rate + rate * (elapsed - 1), "the workers kept up with the rate"
    second = timedelta(seconds=1)
    busiest = max(sum(1 for t in times[i:] if t - first < second) for i, first in enumerate(times))
    print(f"{len(times)} starts in {elapsed:.2f} s; busiest second {busiest}")
    assert busiest <= 2 * rate + 2
