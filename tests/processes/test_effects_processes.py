"""A step's effects across worker processes: each effect exactly once under concurrent
workers, after a kill -9 between the body and its commit, and when a paused worker's
lease was taken by another (its commit fenced, its effects rolled back)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows, start_many
from tests.apps import effects
from tests.apps.chain import marks
from tests.apps.effects import Charge, Parcel
from tests.conftest import Database
from tests.helpers import wait_until
from tests.processes.conftest import WorkerProcesses

WORKFLOWS = "charge,parcel"
EVENTS, OUTBOX = effects.Event.__tablename__, effects.Outbox.__tablename__
CHARGES = 240
MOVED_EVERY = 8  # every 8th charge is cancelled by an operator while its step runs


def counts(db: Database) -> tuple[int, int, int]:
    """(events, parcels, receipts) in the database."""
    [row] = db.sql(
        f"SELECT (SELECT count(*) FROM {EVENTS}), (SELECT count(*) FROM parcels), "
        "(SELECT count(*) FROM receipts)"
    )
    return row


async def start_charges(db: Database, modes: list[str]) -> async_sessionmaker[AsyncSession]:
    Session = await db.create(effects.Base.metadata)
    async with connect_workflows(Session, workflows=[Charge, Parcel]):
        rows = [Charge(reference=f"c{i}", mode=mode) for i, mode in enumerate(modes)]
        assert all(await start_many(rows, Charge.settle))
    return Session


def settled(db: Database, expected: int) -> bool:
    [(done, parcels_left)] = db.sql(
        "SELECT (SELECT count(*) FROM charges WHERE next_step IS NULL), "
        "(SELECT count(*) FROM parcels WHERE next_step IS NOT NULL)"
    )
    return done == expected and parcels_left == 0


async def test_concurrent_workers_leave_each_effect_exactly_once(
    db: Database, workers: WorkerProcesses
) -> None:
    modes = ["move" if i % MOVED_EVERY == 0 else "ok" for i in range(CHARGES)]
    await start_charges(db, modes)
    for _ in range(3):
        workers.start(db.url, "--workflows", WORKFLOWS, "--concurrency", "8")
    await wait_until(lambda: settled(db, CHARGES), timeout=60, interval=0.1, what="all settled")
    landed = modes.count("ok")
    assert counts(db) == (landed, landed, landed)
    # No reference twice: each landed step's effects once, a fenced step's never.
    assert db.sql(
        "SELECT count(DISTINCT charge), count(DISTINCT reference) FROM receipts JOIN parcels "
        "ON parcels.reference = receipts.charge"
    ) == [(landed, landed)]
    assert db.sql(
        "SELECT mode, status, last_error, count(*) FROM charges GROUP BY 1, 2, 3 ORDER BY 1"
    ) == [("move", "new", "cancelled", modes.count("move")), ("ok", "settled", None, landed)]


async def test_a_kill_between_the_body_and_its_commit_leaves_each_effect_once(
    db: Database, workers: WorkerProcesses
) -> None:
    await start_charges(db, ["kill"])
    first = workers.start(db.url, "--workflows", WORKFLOWS, "--lease", "1.0")
    # The body published, started and wrote, then its process was killed before the commit.
    assert first.wait(15) == -signal.SIGKILL
    assert marks(workers.marks, "c0") and counts(db) == (0, 0, 0)
    workers.start(db.url, "--workflows", WORKFLOWS, "--lease", "1.0")
    await wait_until(lambda: settled(db, 1), timeout=15, interval=0.05, what="settled")
    assert counts(db) == (1, 1, 1)
    assert db.sql("SELECT status, attempts FROM charges") == [("settled", 0)]


async def test_a_paused_worker_whose_lease_was_taken_leaves_no_effect(
    db: Database, workers: WorkerProcesses, tmp_path: Path
) -> None:
    await start_charges(db, ["slow"])
    log = tmp_path / "paused.log"
    paused = workers.start(
        db.url, "--workflows", WORKFLOWS, "--lease", "0.6", "--log-level", "INFO", log=log
    )
    await wait_until(lambda: marks(workers.marks, "c0"), timeout=10, interval=0.02)
    os.kill(paused.pid, signal.SIGSTOP)  # its lease runs out while it cannot renew it
    try:
        workers.start(db.url, "--workflows", WORKFLOWS, "--lease", "0.6")
        await wait_until(lambda: settled(db, 1), timeout=15, interval=0.05, what="settled")
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    # The paused attempt wakes, finishes its body and tries to commit: the server has ended
    # its transaction (idle past the lease, which freed the parcel's unique key), so fenced.
    await wait_until(lambda: "fenced" in log.read_text(), timeout=15, interval=0.05)
    assert "effects sat idle past the lease" in log.read_text()
    assert counts(db) == (1, 1, 1)
