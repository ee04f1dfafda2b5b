"""Handlers that start and wake workflows, wired through the outbox (issue 9, "Done when" 3).

- a handler starts a workflow run (`Order(...).start(Order.place)`), and a second
  delivery of the same event to it starts nothing more:
  test_a_handler_starts_a_run_and_another_delivers_to_it
- a handler delivers to a waiting run (`Order.by(...).deliver(Order.paid(...))`), end to
  end with a worker running in the background: the same test
- a handler whose delivery finds no waiting run yet fails its route, and the outbox
  retries it after the backoff until the run waits: test_a_delivery_before_the_wait_is_retried
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
    run_workflows,
)
from engine.testing import drain, move_clock
from tests.apps import outbox as app
from tests.apps.outbox import Order
from tests.conftest import Database
from tests.helpers import wait_until

Sessions = async_sessionmaker[AsyncSession]
started: list[bool] = []


async def start_order(event: WorkflowEvent) -> None:
    started.append(await Order(reference=event.payload["reference"]).start(Order.place))


async def deliver_payment(event: WorkflowEvent) -> None:
    reference, amount = event.payload["reference"], event.payload["amount"]
    accepted = await Order.by(Order.reference == reference).deliver(
        Order.paid(amount), key=event.event_id
    )
    if not accepted:
        raise LookupError(f"no order {reference} is waiting for its payment")


@pytest.fixture
def registry() -> Iterator[DatabaseEventRegistry]:
    chosen = DatabaseEventRegistry(
        settings=EventSettings(mode="production", async_delivery=True, retry_backoff_seconds=1)
    )
    chosen.register("order.placed", start_order)
    chosen.register("payment.received", deliver_payment)
    configure_event_registry(chosen)
    started.clear()
    yield chosen
    configure_event_registry(None)


@pytest.fixture
async def Session(db: Database) -> AsyncIterator[Sessions]:
    sessions = await db.create(app.Base.metadata)
    async with connect_workflows(sessions):
        yield sessions


async def order(Session: Sessions, reference: str) -> Order | None:
    async with Session() as session:
        query = select(Order).where(Order.reference == reference)
        return (await session.execute(query)).scalar_one_or_none()


async def test_a_handler_starts_a_run_and_another_delivers_to_it(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with run_workflows(Session):
        placed = WorkflowEvent("order.placed", "placed", {"reference": "A-1"})
        async with Session() as session:
            session.add(app.Shipment(id=1, address="1 Main St"))
            await registry.publish(placed, session=session)
            await session.commit()

        async def waiting() -> bool:
            row = await order(Session, "A-1")
            return row is not None and row.waiting_for == "paid"

        await wait_until(waiting, timeout=10)
        row = await order(Session, "A-1")
        assert row is not None and row.status == "placed"
        # The same event again (a second publisher, say) starts no second run.
        await start_order(placed)
        assert started == [True, False]

        await registry.publish(
            WorkflowEvent("payment.received", "paid", {"reference": "A-1", "amount": 30})
        )

        async def paid() -> bool:
            row = await order(Session, "A-1")
            return row is not None and row.status == "paid 30"

        await wait_until(paid, timeout=10)
    row = await order(Session, "A-1")
    assert row is not None and row.next_step is None and row.waiting_for is None


async def test_a_delivery_before_the_wait_is_retried(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    payment = WorkflowEvent("payment.received", "paid", {"reference": "B-2", "amount": 5})
    await registry.publish(payment)
    assert await drain(Session) == 1  # no order yet: the route fails, the row backs off
    await registry.publish(WorkflowEvent("order.placed", "placed", {"reference": "B-2"}))
    await drain(Session)  # starts the order, which waits for its payment
    await move_clock(Session, timedelta(seconds=2))
    await drain(Session)  # the payment's retry delivers it
    row = await order(Session, "B-2")
    assert row is not None and row.status == "paid 5"
