"""Guarantees that need real processes: kill -9, many workers, NOTIFY across processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from statistics import median

from sqlalchemy import func, select

from engine import connect_workflows
from tests.apps import chain
from tests.apps.chain import Chain, ChainAttempt, Slow, Timed, marks
from tests.conftest import Database
from tests.helpers import other_sessions_idle, wait_until
from tests.processes.conftest import WorkerProcesses

RUNS = 2000
WORKER_PROCESSES = 4


async def test_a_step_killed_mid_way_runs_again_after_its_lease(
    db: Database, workers: WorkerProcesses
) -> None:
    Session = await db.create(chain.Base.metadata)
    first = workers.start(db.url, "--workflows", "slow", "--lease", "1.5")
    async with connect_workflows(Session, workflows=[Slow]):
        row = Slow()
        assert await row.start(Slow.work)
        await wait_until(lambda: marks(workers.marks, f"slow-{row.id}"), timeout=10, interval=0.05)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(5)
        killed_at = time.monotonic()
        workers.start(db.url, "--workflows", "slow", "--lease", "1.5")

        async def finished() -> bool:
            async with Session() as session:
                return (
                    await session.get(Slow, row.id, populate_existing=True)
                ).finished_by is not None  # type: ignore[union-attr]

        await wait_until(finished, timeout=15, interval=0.05)
        waited = time.monotonic() - killed_at
        async with Session() as session:
            done = await session.get(Slow, row.id)
            assert done is not None and done.claimed_until is None and done.next_step is None
            assert done.finished_by != first.pid
        ran = marks(workers.marks, f"slow-{row.id}")
        assert len(ran) == 2, "the step runs again, at least once"
        assert waited < 10, "taken again once the lease ran out, not later"
        assert [(h.step, h.outcome) for h in await row.history()] == [("work", "ok")]


IN_FLIGHT = 32  # runs a worker holds when it is killed
TAKEN_AGAIN_WITHIN = 45.0  # seconds, at the default lease


async def test_a_killed_workers_runs_are_finished_by_another_within_the_default_lease(
    db: Database, workers: WorkerProcesses
) -> None:
    Session = await db.create(chain.Base.metadata)
    concurrency = str(IN_FLIGHT)
    first = workers.start(db.url, "--workflows", "slow", "--concurrency", concurrency)
    async with connect_workflows(Session, workflows=[Slow]):
        rows = [Slow() for _ in range(IN_FLIGHT)]
        assert all(await asyncio.gather(*(row.start(Slow.work) for row in rows)))
        names = [f"slow-{row.id}" for row in rows]
        await wait_until(
            lambda: all(marks(workers.marks, name) for name in names), timeout=20, interval=0.05
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait(5)
        killed_at = time.monotonic()
        second = workers.start(db.url, "--workflows", "slow", "--concurrency", concurrency)

        async def finished() -> bool:
            async with Session() as session:
                left = await session.scalar(
                    select(func.count()).select_from(Slow).where(Slow.finished_by.is_(None))
                )
                return left == 0

        await wait_until(finished, timeout=TAKEN_AGAIN_WITHIN + 15, interval=0.2)
        waited = time.monotonic() - killed_at
        async with Session() as session:
            by = set((await session.scalars(select(Slow.finished_by))).all())
        assert by == {second.pid}
        assert waited < TAKEN_AGAIN_WITHIN, f"taken again {waited:.1f} s after the kill"
        for row in rows:
            assert [(h.step, h.outcome) for h in await row.history()] == [("work", "ok")]


async def test_four_worker_processes_finish_2000_three_step_runs_exactly_once(
    db: Database, workers: WorkerProcesses
) -> None:
    Session = await db.create(chain.Base.metadata)
    for _ in range(WORKER_PROCESSES):
        workers.start(db.url, "--workflows", "chain3", "--concurrency", "8")
    async with connect_workflows(Session, workflows=[Chain]):
        rows = [Chain() for _ in range(RUNS)]
        for batch in range(0, RUNS, 100):
            started = await asyncio.gather(
                *(r.start(Chain.first) for r in rows[batch : batch + 100])
            )
            assert all(started)

        async def all_done() -> bool:
            async with Session() as session:
                left = await session.scalar(
                    select(func.count()).select_from(Chain).where(Chain.next_step.isnot(None))
                )
                return left == 0

        await wait_until(all_done, timeout=120, interval=0.2)
    async with Session() as session:
        done = (await session.execute(select(Chain.done, func.count()).group_by(Chain.done))).all()
        assert done == [("abc", RUNS)]
        claimed = await session.scalar(
            select(func.count()).select_from(Chain).where(Chain.claimed_until.isnot(None))
        )
        assert claimed == 0
        per_step = (
            await session.execute(
                select(ChainAttempt.run_key, ChainAttempt.step, func.count())
                .where(ChainAttempt.outcome == "ok")
                .group_by(ChainAttempt.run_key, ChainAttempt.step)
            )
        ).all()
        assert len(per_step) == RUNS * 3
        assert {count for _, _, count in per_step} == {1}
        others = await session.scalar(
            select(func.count()).select_from(ChainAttempt).where(ChainAttempt.outcome != "ok")
        )
        assert others == 0


async def test_a_start_from_another_process_runs_within_50_ms(
    db: Database, workers: WorkerProcesses
) -> None:
    Session = await db.create(chain.Base.metadata)
    workers.start(db.url, "--workflows", "timed", "--idle", "30")
    latencies = []
    engine = Session.kw["bind"]
    async with connect_workflows(Session, workflows=[Timed]):
        # The worker is asleep, with nothing due for 30 s: none of its sessions is busy.
        await wait_until(lambda: other_sessions_idle(engine))
        for _ in range(10):
            row = Timed()
            before = time.time()
            assert await row.start(Timed.run)

            async def ran(row: Timed = row) -> bool:
                async with Session() as session:
                    found = await session.get(Timed, row.id, populate_existing=True)
                    return found is not None and found.ran_at is not None

            await wait_until(ran, timeout=5, interval=0.005)
            async with Session() as session:
                found = await session.get(Timed, row.id)
                assert found is not None and found.ran_at is not None
                latencies.append(found.ran_at - before)
            await wait_until(lambda: other_sessions_idle(engine))  # asleep again
    assert median(latencies) < 0.05, latencies
    assert max(latencies) < 0.25, latencies
