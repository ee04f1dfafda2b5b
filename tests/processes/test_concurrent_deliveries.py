"""Many deliveries to one waiting run at once, from several processes and connections.

Each delivering process (`python -m tests.apps.waits`) has its own engine and
pool, opens one connection per delivery, says "ready", and delivers all of
them at once on "go", so fifty deliveries meet on one row. No worker runs
while they do: what each returned depends on the row alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.testing import drain
from tests.apps import waits
from tests.apps.waits import Waiter
from tests.conftest import Database
from tests.helpers import fetch
from tests.processes.conftest import REPO_ROOT

pytestmark = pytest.mark.processes

PROCESSES = 5
PER_PROCESS = 10  # concurrent deliveries in each process, one connection each
READY_TIMEOUT = 20.0  # seconds for a delivering process to connect
DONE_TIMEOUT = 20.0  # seconds for it to deliver and report


async def deliver_from_processes(url: str, run_id: int, batches: list[list[int]]) -> list[int]:
    """Deliver `Waiter.answer(v)` with key `k<v>` for every v, a process per batch, at once.

    Returns what deliver returned, in the order of the values given.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.apps.waits",
            url,
            str(run_id),
            *map(str, batch),
            cwd=REPO_ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for batch in batches
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            ready = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT)
            assert ready.strip() == b"ready", f"a delivering process said {ready!r}"
        for process in processes:  # every process is connected: go, all at once
            assert process.stdin is not None
            process.stdin.write(b"go\n")
        reports = [
            await asyncio.wait_for(process.communicate(), DONE_TIMEOUT) for process in processes
        ]
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert all(process.returncode == 0 for process in processes)
    got: list[int] = []
    for batch, (stdout, _) in zip(batches, reports, strict=True):
        results = json.loads(stdout.splitlines()[-1])  # this process's: value -> returned
        got.extend(results[str(value)] for value in batch)
    return got


def fifty() -> list[list[int]]:
    """Values 0..49 in five batches of ten: fifty distinct keys."""
    return [list(range(p * PER_PROCESS, (p + 1) * PER_PROCESS)) for p in range(PROCESSES)]


async def waiting_run(
    db: Database, after_answer: str
) -> tuple[async_sessionmaker[AsyncSession], Waiter]:
    """A fresh database with one Waiter waiting for its answer; its session factory and row."""
    Session = await db.create(waits.Base.metadata)
    async with connect_workflows(Session, workflows=[Waiter]):
        row = Waiter(after_answer=after_answer)
        assert await row.start(Waiter.begin)
    await drain(Session, [Waiter])
    assert (await fetch(Session, Waiter, row.id)).waiting_for == "answer"
    return Session, row


async def test_fifty_concurrent_deliveries_answer_a_wait_once_and_lose_no_accepted_event(
    db: Database,
) -> None:
    Session, row = await waiting_run(db, after_answer="wait")
    batches = fifty()
    values = [value for batch in batches for value in batch]
    got = await deliver_from_processes(db.url, row.id, batches)
    assert set(got) <= {0, 1}
    accepted = [value for value, result in zip(values, got, strict=True) if result == 1]
    # One event answers the wait; until a worker takes it, it is the one held, so every
    # other delivery is refused.
    assert len(accepted) == 1, got

    await drain(Session, [Waiter])
    stored = await fetch(Session, Waiter, row.id)
    assert sorted(stored.received) == sorted(accepted), "every accepted event is applied, no other"
    assert stored.endings == [[n + 1, "answer"] for n in range(len(accepted))], (
        "each wait is answered once"
    )
    assert stored.timeouts == 0 and stored.waiting_for == "answer"
    assert stored.recent_event_keys == [f"k{value}" for value in stored.received]

    # Two processes at once resend the keys whose events ran (refused), and send one fresh
    # key (one of them accepts it, the other is refused as its event has not run yet).
    resent = [*accepted, 100]
    again = await deliver_from_processes(db.url, row.id, [resent, resent])
    assert again[: len(accepted)] == again[len(resent) : -1] == [0] * len(accepted)
    assert sorted([again[len(accepted)], again[-1]]) == [0, 1]
    await drain(Session, [Waiter])
    assert (await fetch(Session, Waiter, row.id)).received[-1] == 100
    assert await deliver_from_processes(db.url, row.id, [[100]]) == [0], "k100 was taken"


async def test_of_fifty_concurrent_deliveries_to_one_waiting_run_exactly_one_is_accepted(
    db: Database,
) -> None:
    _, row = await waiting_run(db, after_answer="stop")
    got = await deliver_from_processes(db.url, row.id, fifty())
    assert sorted(got) == [0] * 49 + [1]
