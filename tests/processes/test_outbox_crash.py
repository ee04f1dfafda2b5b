"""The outbox under kill -9: a drain process killed mid-batch loses nothing, and no
handler whose success was recorded runs again (issue 9, "Done when" 2)."""

from __future__ import annotations

import os
import signal
from collections import Counter

from sqlalchemy import func, select

from engine import WorkflowEvent, connect_workflows
from tests.apps import outbox as app
from tests.conftest import Database
from tests.helpers import wait_until
from tests.processes.conftest import WorkerProcesses

EVENTS = 400
LEASE = 2.0  # the claim TTL of the drain processes, in seconds


async def test_a_drain_killed_mid_batch_loses_nothing_and_reruns_no_recorded_success(
    db: Database, workers: WorkerProcesses
) -> None:
    Session = await db.create(app.Base.metadata)
    registry = app.process_registry()
    async with connect_workflows(Session):
        events = [WorkflowEvent("bulk.created", "created", {"n": n}) for n in range(EVENTS)]
        async with Session() as session:
            for start in range(0, EVENTS, 100):
                await registry.publish_many(events[start : start + 100], session=session)
            await session.commit()

        async def handler_runs() -> int:
            async with Session() as session:
                query = select(func.count()).select_from(app.HandlerRun)
                return int((await session.execute(query)).scalar_one())

        first = workers.start(
            db.url, "--workflows", "outbox", "--lease", str(LEASE), "--concurrency", "50"
        )

        async def halfway() -> bool:
            return await handler_runs() >= EVENTS // 2

        await wait_until(halfway, timeout=30, interval=0.01)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(5)

        async with Session() as session:
            succeeded = {
                (row.event_id, row.handler)
                for row in await session.execute(
                    select(app.Delivery.event_id, app.Delivery.handler).where(
                        app.Delivery.status == "succeeded"
                    )
                )
            }
            in_flight = (
                await session.execute(
                    select(func.count())
                    .select_from(app.Outbox)
                    .where(app.Outbox.claimed_until.is_not(None))
                )
            ).scalar_one()
        assert in_flight > 0, "the kill landed mid-batch: rows were claimed and unsettled"
        assert 0 < len(succeeded) < 2 * EVENTS

        workers.start(db.url, "--workflows", "outbox", "--lease", str(LEASE))

        async def all_processed() -> bool:
            async with Session() as session:
                query = select(func.count()).select_from(app.Outbox)
                settled = query.where(app.Outbox.status == "processed")
                return int((await session.execute(settled)).scalar_one()) == EVENTS

        await wait_until(all_processed, timeout=60, interval=0.1)

        async with Session() as session:
            runs = Counter(
                (row.event_id, row.handler)
                for row in await session.execute(
                    select(app.HandlerRun.event_id, app.HandlerRun.handler)
                )
            )
            statuses = Counter(
                row.status for row in await session.execute(select(app.Delivery.status))
            )
    handler_of = {
        "tests.apps.outbox.first_handler": "first",
        "tests.apps.outbox.second_handler": "second",
    }
    for event in events:
        for handler in ("first", "second"):
            assert runs[(event.event_id, handler)] >= 1, "every event reached every handler"
    for event_id, handler in succeeded:
        assert runs[(event_id, handler_of[handler])] == 1, "a recorded success never reruns"
    assert statuses == Counter({"succeeded": 2 * EVENTS})
    # Only calls in flight at the kill can have run twice.
    assert sum(count - 1 for count in runs.values()) <= 50 * 2
