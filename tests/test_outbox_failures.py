"""What the outbox tells an operator of failures and of time.

- each failed route is logged with its error's class and first line, the event id, the
  route's handler and the drain's number; no payload, no traceback at INFO (the
  traceback at DEBUG); the drain's summary line counts the failed routes:
  test_a_failed_route_is_logged_with_its_error_and_the_drains_summary,
  test_a_failed_routes_traceback_is_logged_at_debug
- handler calls before the dead letter are (retries + 1) x DULY_MAX_RETRIES: a route's
  retries run inside one drain, and the row is drained up to DULY_MAX_RETRIES times:
  test_handler_calls_before_the_dead_letter_are_retries_plus_one_times_max_retries
- the times the outbox writes are the database clock's (which tests move): a settled
  row's settled_at, its and its record's created_at, its delivery's updated_at:
  test_the_outbox_writes_the_database_clocks_times
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
)
from engine.base.clock import db_now
from engine.model.connection import session_engine
from engine.testing import drain, move_clock
from tests.apps import outbox as app
from tests.conftest import Database

Sessions = async_sessionmaker[AsyncSession]
EVENTS_LOGGER = "duly.events"
SECRET = "card-4242-4242"  # a payload value no log line may show


@pytest.fixture
async def Session(db: Database) -> AsyncIterator[Sessions]:
    sessions = await db.create(app.Base.metadata)
    async with connect_workflows(sessions):
        yield sessions


@pytest.fixture(autouse=True)
def unconfigured() -> Iterator[None]:
    yield
    configure_event_registry(None)


def use(**overrides: Any) -> DatabaseEventRegistry:
    """A production registry with these settings, configured for the process."""
    values: dict[str, Any] = {"mode": "production", "async_delivery": True, **overrides}
    chosen = DatabaseEventRegistry(settings=EventSettings(**values))
    configure_event_registry(chosen)
    return chosen


def placed() -> WorkflowEvent:
    return WorkflowEvent("order.placed", "placed", {"card": SECRET})


async def charge(event: WorkflowEvent) -> None:
    raise ConnectionError("payment provider down\nsecond line of detail")


async def notify(event: WorkflowEvent) -> None:
    return None


def of_event(model: type[Any], event: WorkflowEvent) -> Select[Any]:
    return select(model).where(model.event_id == event.event_id)


async def database_time(Session: Sessions) -> datetime:
    async with session_engine(Session).connect() as conn:
        now: datetime = (await conn.execute(select(db_now()))).scalar_one()
    return now


async def test_a_failed_route_is_logged_with_its_error_and_the_drains_summary(
    Session: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    registry = use(max_retries=3, retry_backoff_seconds=5)
    registry.register("order.placed", charge, retries=1)
    registry.register("order.placed", notify)
    registry.register("placed", charge)
    event = placed()
    await registry.publish(event)
    with caplog.at_level(logging.INFO, logger=EVENTS_LOGGER):
        assert await drain(Session) == 1
    lines = [r for r in caplog.records if r.name == EVENTS_LOGGER]
    failures = [r.getMessage() for r in lines if " failed in drain " in r.getMessage()]
    handler = f"{__name__}.charge"
    assert failures == [
        f"event {event.event_id} (order.placed): order.placed → {handler} failed in drain "
        "1 of 3 after 2 handler calls: ConnectionError: payment provider down",
        f"event {event.event_id} (order.placed): placed → {handler} failed in drain "
        "1 of 3 after 1 handler call: ConnectionError: payment provider down",
    ]
    summary = [r.getMessage() for r in lines if "routes failed" in r.getMessage()]
    assert summary == [
        f"event {event.event_id} (order.placed): drain 1 of 3: 2 of 3 routes failed, "
        "the event is processed (its failed routes dead-lettered)"
    ]
    assert all(r.exc_info is None for r in lines if r.levelno >= logging.INFO)
    said = "\n".join(caplog.handler.format(r) for r in lines)
    assert SECRET not in said and "second line" not in said and "Traceback" not in said


async def test_a_failed_routes_traceback_is_logged_at_debug(
    Session: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    registry = use(max_retries=2, retry_backoff_seconds=5)
    registry.register("order.placed", charge)
    event = placed()
    await registry.publish(event)
    with caplog.at_level(logging.DEBUG, logger=EVENTS_LOGGER):
        assert await drain(Session) == 1
    lines = [r for r in caplog.records if r.name == EVENTS_LOGGER]
    [traced] = [r for r in lines if r.exc_info is not None]
    assert traced.levelno == logging.DEBUG
    assert "in charge" in caplog.text and "Traceback" in caplog.text
    summary = [r.getMessage() for r in lines if "routes failed" in r.getMessage()]
    assert summary == [
        f"event {event.event_id} (order.placed): drain 1 of 2: 1 of 1 routes failed, "
        "due again in 0:00:05"
    ]


@pytest.mark.parametrize(("retries", "max_retries"), [(2, 3), (0, 2), (1, 1)])
async def test_handler_calls_before_the_dead_letter_are_retries_plus_one_times_max_retries(
    Session: Sessions, retries: int, max_retries: int
) -> None:
    registry = use(max_retries=max_retries, retry_backoff_seconds=1)
    calls: list[str] = []
    dead: list[str] = []

    async def always_fails(event: WorkflowEvent) -> None:
        calls.append(event.event_id)
        raise ConnectionError("down")

    registry.register(
        "order.placed",
        always_fails,
        retries=retries,
        dead_letter=lambda event, error: dead.append(event.event_id),
    )
    event = placed()
    await registry.publish(event)
    drains = 0
    while not dead:
        assert await drain(Session) == 1
        drains += 1
        await move_clock(Session, timedelta(seconds=drains + 1))  # past the row's backoff
    # Each drain calls the handler retries + 1 times; the row is drained max_retries times.
    assert drains == max_retries
    assert len(calls) == (retries + 1) * max_retries
    async with Session() as session:
        row = await session.get(app.Outbox, event.event_id)
        [delivery] = (await session.execute(of_event(app.Delivery, event))).scalars()
    assert row is not None and (row.status, row.route_attempts) == ("dead_letter", max_retries)
    assert delivery.attempts == len(calls)  # the delivery row adds every drain's calls


async def test_the_outbox_writes_the_database_clocks_times(Session: Sessions) -> None:
    registry = use()
    registry.register("order.placed", notify)
    await move_clock(Session, timedelta(days=-10))
    before = await database_time(Session)
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    after = await database_time(Session)
    async with Session() as session:
        row = await session.get(app.Outbox, event.event_id)
        record = await session.get(app.Event, event.event_id)
        [delivery] = (await session.execute(of_event(app.Delivery, event))).scalars()
    assert row is not None and row.status == "processed" and record is not None
    # Ten days before Python's clock: each time is the moved database time, not Python's.
    for written in (row.settled_at, row.created_at, record.created_at, delivery.updated_at):
        assert written is not None and before <= written <= after
