"""The database registry and the outbox, one test per sentence of their rules
("DatabaseEventRegistry persists events and outbox rows ...", the outbox settings, "When
database outbox processing fails ...", "Dead letters are controlled by ...", "When one
applicable database handler succeeds and another fails ...", "Outbox and delivery"),
and the engine's own (the outbox is due work of the engine's one claim).

Publishing
- the event and its outbox row are written in the caller's transaction, and publish()
  returns False: test_publish_writes_in_the_callers_transaction_and_returns_false
- a rolled-back business change publishes nothing: test_a_rolled_back_change_publishes_nothing
- a batch is one statement: test_a_batch_is_one_statement
- duplicate async publishes return False without a new outbox row or a second routing:
  test_a_duplicate_publish_stores_and_routes_nothing_new
- an event that is not JSON is a typed error and writes nothing:
  test_an_event_that_is_not_json_is_refused_and_writes_nothing
- with async delivery off and no session, publish() is publish_sync():
  test_with_async_off_publish_routes_inline
- publish_sync commits persistence before inline routing:
  test_publish_sync_commits_the_event_before_routing
- publish_sync returns True when one applicable handler completed, even if another
  failed: test_publish_sync_is_true_when_one_route_completed
- a duplicate publish_sync still routes the event given; a route that succeeded for that
  id is not run again: test_a_duplicate_publish_sync_routes_again_but_not_succeeded_routes
- non-duplicate persistence errors propagate and prevent routing:
  test_a_persistence_error_propagates_and_routes_nothing

Draining (the engine's one claim)
- outbox rows are runs of the outbox's `route` step, drained by the workers:
  test_an_outbox_row_is_a_run_the_worker_drains
- a failed row's retry time is the next-due instant on_idle reports:
  test_a_failed_rows_retry_is_the_next_due_instant
- a row whose claim was abandoned mid-drain is routed once its lease (the claim TTL)
  ends, and a route that had succeeded is not run again:
  test_an_abandoned_claim_is_drained_after_its_lease_without_rerunning_succeeded_routes

Delivery attempts
- one delivery row per route and event, with its status and handler calls:
  test_one_delivery_row_per_route_and_event
- a route that succeeded for an event never runs for it again:
  test_a_succeeded_route_is_not_rerun_when_the_row_is_retried
- a drain whose own bookkeeping meets a lost database is tried again, not given up:
  test_a_drain_whose_bookkeeping_meets_a_lost_database_is_tried_again
- a handler whose database goes away has not failed its route: the drain is tried again
  whole (not dead-lettered beside a route that succeeded), and the route that succeeded
  is not run again: test_a_handler_that_loses_its_database_is_retried_not_dead_lettered;
  through publish_sync, the outage is raised to the caller and the stored event is left
  to a drain: test_publish_sync_whose_handler_loses_its_database_leaves_the_event_to_a_drain
- handler-level retries are attempts inside one drain; outbox attempts count drains:
  test_handler_retries_happen_inside_one_drain
- a handler running past DULY_DELIVERY_RUNNING_TIMEOUT_SECONDS fails its route:
  test_a_handler_past_the_running_timeout_fails

Outbox attempts, backoff and dead letters
- a failed drain increments the row's attempts and makes it due after
  RETRY_BACKOFF_SECONDS x attempts: test_a_failed_drain_backs_off_by_attempts
- at MAX_RETRIES with dead letters enabled the row moves to dead_letter and the route's
  dead-letter handler hears of it once: test_the_last_retry_moves_the_row_to_dead_letter
- with dead letters disabled the row stays failed and due again with backoff:
  test_with_dead_letters_off_the_row_stays_failed_and_due_again
- MAX_RETRIES=0 dead-letters at the first failed drain:
  test_max_retries_zero_dead_letters_at_once
- one route succeeds and another fails: the row is processed and the failed route is
  dead-lettered: test_a_successful_route_makes_the_row_processed_and_the_failure_dead
- a validator failure is dead-lettered at once, not retried, not counted as a failed
  drain: test_a_validator_refusal_is_dead_lettered_at_once
- predicate, retry_on and dead-letter handler exceptions are recorded as outbox failures:
  test_a_predicate_exception_is_an_outbox_failure,
  test_a_retry_on_exception_is_an_outbox_failure,
  test_a_dead_letter_handler_exception_is_an_outbox_failure
- no applicable route (none registered, or `when` says no): the row is processed:
  test_a_row_without_applicable_routes_is_processed

Replay
- replaying dead letters makes them due again; their dead routes run again, succeeded
  ones do not: test_replay_runs_dead_routes_again_but_not_succeeded_ones
- replay by id touches only those rows, and never a row that is not dead:
  test_replay_by_id_touches_only_dead_rows_named

Logging
- the outbox's drains are not written to the attempt log (its delivery attempts are its
  log), while other workflows' are: test_drains_write_delivery_rows_not_attempt_log_rows

Batching
- delivery rows are written in statements of at most the chunk size:
  test_delivery_rows_are_written_in_chunks

Telemetry (prometheus-client installed)
- drains by status and their time, delivery attempts by status, duplicates ignored and
  claim sizes are counted: test_drains_deliveries_duplicates_and_claims_are_counted
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import event as sa_event, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DatabaseEventRegistry,
    EventError,
    EventSettings,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
    run_workflows,
)
from engine.claims.claim import claim_due
from engine.events.deliveries import Delivery, DeliveryLog, delivery_log
from engine.model.connection import current_connection, session_engine
from engine.model.registry import workflow_info
from engine.testing import drain, move_clock
from tests.apps import outbox as app
from tests.conftest import Database

Sessions = async_sessionmaker[AsyncSession]


def settings(**overrides: Any) -> EventSettings:
    """Production settings for the tests; small numbers where a test wants them."""
    values: dict[str, Any] = {"mode": "production", "async_delivery": True, **overrides}
    return EventSettings(**values)


@pytest.fixture
async def Session(db: Database) -> AsyncIterator[Sessions]:
    sessions = await db.create(app.Base.metadata)
    async with connect_workflows(sessions):
        yield sessions


@pytest.fixture
def registry() -> Iterator[DatabaseEventRegistry]:
    chosen = DatabaseEventRegistry(settings=settings())
    configure_event_registry(chosen)
    yield chosen
    configure_event_registry(None)


def use(**overrides: Any) -> DatabaseEventRegistry:
    """A registry with these settings, configured for the process (the fixture resets it)."""
    chosen = DatabaseEventRegistry(settings=settings(**overrides))
    configure_event_registry(chosen)
    return chosen


def placed(event_id: str | None = None, **payload: Any) -> WorkflowEvent:
    if event_id is None:
        return WorkflowEvent("order.placed", "placed", payload)
    return WorkflowEvent("order.placed", "placed", payload, event_id=event_id)


async def outbox_row(Session: Sessions, event_id: str) -> app.Outbox:
    async with Session() as session:
        row = await session.get(app.Outbox, event_id, populate_existing=True)
        assert row is not None
        return row


async def deliveries(Session: Sessions, event_id: str) -> list[app.Delivery]:
    async with Session() as session:
        query = select(app.Delivery).where(app.Delivery.event_id == event_id)
        ordered = query.order_by(app.Delivery.handler, app.Delivery.event_key)
        return list((await session.execute(ordered)).scalars())


async def count(Session: Sessions, model: type[Any]) -> int:
    async with Session() as session:
        return int((await session.execute(select(func.count()).select_from(model))).scalar_one())


class Calls:
    """Handlers that remember their calls and fail while told to."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.failures_left = 0
        self.dead: list[tuple[str, str]] = []

    async def ok(self, event: WorkflowEvent) -> None:
        self.calls.append(f"ok:{event.event_id}")

    async def flaky(self, event: WorkflowEvent) -> None:
        self.calls.append(f"flaky:{event.event_id}")
        if self.failures_left:
            self.failures_left -= 1
            raise ConnectionError("provider down")

    async def broken(self, event: WorkflowEvent) -> None:
        self.calls.append(f"broken:{event.event_id}")
        raise ConnectionError("always down")

    def dead_letter(self, event: WorkflowEvent, error: BaseException) -> None:
        self.dead.append((event.event_id, str(error)))


def loses_its_database_once(Session: Sessions, calls: Calls) -> Callable[..., Awaitable[None]]:
    """A handler that reads the database; the first time, the server ends its connection
    ("terminating connection due to administrator command", 57P01, as in a restart)."""
    lost: list[str] = []

    async def reads_the_database(event: WorkflowEvent) -> None:
        async with Session() as session:
            if not lost:
                lost.append(event.event_id)
                await session.execute(select(func.pg_terminate_backend(func.pg_backend_pid())))
            await session.execute(select(1))
        calls.calls.append(f"db:{event.event_id}")

    return reads_the_database


# Publishing


async def test_publish_writes_in_the_callers_transaction_and_returns_false(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    event = placed(order=1)
    async with Session() as session:
        session.add(app.Shipment(id=1, address="1 Main St"))
        assert await registry.publish(event, session=session) is False
        # Not visible outside the transaction until it commits.
        assert await count(Session, app.Outbox) == 0
        await session.commit()
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.next_step, row.route_attempts) == ("pending", "route", 0)
    assert row.next_args == {"kwargs": {"event": row.next_args["kwargs"]["event"]}}
    async with Session() as session:
        record = await session.get(app.Event, event.event_id)
        assert record is not None
        assert (record.event_type, record.event_name, record.payload) == (
            "order.placed",
            "placed",
            {"order": 1},
        )
        assert record.occurred_at == event.occurred_at


async def test_a_rolled_back_change_publishes_nothing(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    async with Session() as session:
        session.add(app.Shipment(id=1, address="1 Main St"))
        await registry.publish_many([placed(), placed()], session=session)
        await session.rollback()
    assert await count(Session, app.Event) == 0
    assert await count(Session, app.Outbox) == 0
    assert await drain(Session) == 0
    assert calls.calls == []


async def test_a_batch_is_one_statement(Session: Sessions, registry: DatabaseEventRegistry) -> None:
    statements: list[str] = []

    def count_statement(*args: Any) -> None:
        statements.append(args[2])

    sync_engine = session_engine(Session).sync_engine
    sa_event.listen(sync_engine, "before_cursor_execute", count_statement)
    try:
        async with Session() as session:
            await session.execute(select(1))  # the transaction has begun
            statements.clear()
            stored = await registry.publish_many([placed(n=n) for n in range(50)], session=session)
            assert len(statements) == 1
            await session.commit()
    finally:
        sa_event.remove(sync_engine, "before_cursor_execute", count_statement)
    assert len(stored) == 50
    assert await count(Session, app.Outbox) == 50


async def test_a_duplicate_publish_stores_and_routes_nothing_new(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    event = placed("evt-1")
    assert await registry.publish(event) is False
    assert await drain(Session) == 1
    assert await registry.publish(placed("evt-1", other=True)) is False
    assert await registry.publish_many([event, placed("evt-2")]) == ["evt-2"]
    assert await count(Session, app.Outbox) == 2
    assert await drain(Session) == 1  # only evt-2
    assert calls.calls == ["ok:evt-1", "ok:evt-2"]


async def test_an_event_that_is_not_json_is_refused_and_writes_nothing(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    good = placed()
    bad = WorkflowEvent("order.placed", "placed", {"when": datetime.now(UTC)})
    with pytest.raises(EventError, match="payload is not JSON"):
        await registry.publish_many([good, bad])
    with pytest.raises(EventError, match="WorkflowEvent"):
        await registry.publish_many([{"event_type": "x"}])  # type: ignore[list-item]
    assert isinstance(EventError(), TypeError)
    assert await count(Session, app.Event) == 0


async def test_with_async_off_publish_routes_inline(Session: Sessions) -> None:
    registry = use(async_delivery=False)
    calls = Calls()
    registry.register("order.placed", calls.ok)
    event = placed()
    assert await registry.publish(event) is True
    assert calls.calls == [f"ok:{event.event_id}"]
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.next_step, row.claimed_until) == ("processed", None, None)
    assert await drain(Session) == 0
    configure_event_registry(None)


async def test_publish_sync_commits_the_event_before_routing(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    seen_by_others: list[int] = []

    async def look(event: WorkflowEvent) -> None:
        # Another connection already sees the event and its row (held, not due).
        seen_by_others.append(await count(Session, app.Event))
        row = await outbox_row(Session, event.event_id)
        assert row.claimed_until is not None and row.status == "pending"

    registry.register("order.placed", look)
    assert await registry.publish_sync(placed()) is True
    assert seen_by_others == [1]
    assert await drain(Session) == 0  # the row in hand is not due to anyone else


async def test_publish_sync_is_true_when_one_route_completed(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.broken)
    registry.register("order.placed", calls.ok)
    event = placed()
    assert await registry.publish_sync(event) is True
    row = await outbox_row(Session, event.event_id)
    assert row.status == "processed"
    assert [d.status for d in await deliveries(Session, event.event_id)] == [
        "dead_letter",
        "succeeded",
    ]
    nothing = Calls()
    only_broken = use()
    only_broken.register("order.placed", nothing.broken)
    assert await only_broken.publish_sync(placed()) is False


async def test_a_duplicate_publish_sync_routes_again_but_not_succeeded_routes(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    event = placed("evt-dup")
    assert await registry.publish_sync(event) is True
    registry.register("order.placed", calls.flaky)  # a new route since
    assert await registry.publish_sync(placed("evt-dup", changed=True)) is True
    assert calls.calls == ["ok:evt-dup", "flaky:evt-dup"]
    assert await registry.publish_sync(event) is False  # both succeeded already
    assert await count(Session, app.Outbox) == 1


async def test_a_persistence_error_propagates_and_routes_nothing(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    with pytest.raises(EventError):
        await registry.publish_sync(WorkflowEvent("order.placed", "placed", {"x": {1, 2}}))
    nul = WorkflowEvent("order.placed", "placed\x00", {})  # PostgreSQL refuses NUL in text
    with pytest.raises(Exception, match=r"NUL|0x00"):
        await registry.publish_sync(nul)
    assert calls.calls == []
    assert await count(Session, app.Event) == 0


# Draining


async def test_an_outbox_row_is_a_run_the_worker_drains(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    async with run_workflows(Session, workflows=[app.Outbox]):
        event = placed()
        async with Session() as session:
            await registry.publish(event, session=session)
            await session.commit()

        async def routed() -> bool:
            return (await outbox_row(Session, event.event_id)).status == "processed"

        for _ in range(400):
            if await routed():
                break
            await asyncio.sleep(0.01)
    assert calls.calls == [f"ok:{event.event_id}"]
    row = await outbox_row(Session, event.event_id)
    assert (row.next_step, row.next_args, row.wake_at, row.claimed_until) == (None,) * 4
    assert row.settled_at is not None


async def test_a_failed_rows_retry_is_the_next_due_instant(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.broken)
    told: list[datetime | None] = []
    async with run_workflows(Session, workflows=[app.Outbox], on_idle=told.append) as worker:
        event = placed()
        await registry.publish(event)
        for _ in range(400):
            row = await outbox_row(Session, event.event_id)
            if row.status == "failed" and told and told[-1] is not None:
                break
            await asyncio.sleep(0.01)
        assert await worker.wake(5)
    row = await outbox_row(Session, event.event_id)
    assert row.status == "failed" and row.wake_at is not None
    assert told[-1] == row.wake_at


async def test_an_abandoned_claim_is_drained_after_its_lease_without_rerunning_succeeded_routes(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    registry.register("order.placed", calls.flaky)
    event = placed()
    await registry.publish(event)
    # A drain claims the row and records its first route's success, then dies.
    connection = current_connection()
    info = workflow_info(app.Outbox)
    async with connection.autocommit.connect() as conn:
        claimed = await claim_due(conn, info, 1, timedelta(seconds=300))
    assert len(claimed) == 1
    ok_route = registry.routes.matching(event)[0]
    log = registry.deliveries(connection.autocommit)
    await log.record([Delivery.of(event.event_id, ok_route, "succeeded", 1, None)])
    assert await drain(Session) == 0  # leased: nobody else takes it
    await move_clock(Session, timedelta(seconds=301))
    assert await drain(Session) == 1
    assert calls.calls == [f"flaky:{event.event_id}"]
    assert (await outbox_row(Session, event.event_id)).status == "processed"


# Delivery attempts


async def test_one_delivery_row_per_route_and_event(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    registry.register("placed", calls.ok)  # another route (by name) to the same handler
    first, second = placed(), placed()
    await registry.publish_many([first, second])
    assert await drain(Session) == 2
    rows = await deliveries(Session, first.event_id)
    assert [(d.event_key, d.status, d.attempts, d.error) for d in rows] == [
        ("order.placed", "succeeded", 1, None),
        ("placed", "succeeded", 1, None),
    ]
    assert rows[0].handler == "tests.test_outbox.Calls.ok"
    assert await count(Session, app.Delivery) == 4


async def test_a_succeeded_route_is_not_rerun_when_the_row_is_retried(Session: Sessions) -> None:
    registry = use(max_retries=3, retry_backoff_seconds=1)
    calls = Calls()
    pager = ["down"]

    def page(event: WorkflowEvent, error: BaseException) -> None:
        if pager:
            raise RuntimeError(pager.pop())
        calls.dead.append((event.event_id, str(error)))

    registry.register("order.placed", calls.ok)
    registry.register("order.placed", calls.broken, dead_letter=page)
    event = placed()
    await registry.publish(event)
    # ok succeeds, broken fails and its dead-letter handler raises: the drain failed.
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts) == ("failed", 1)
    await move_clock(Session, timedelta(seconds=2))
    assert await drain(Session) == 1
    # The retry ran only the route that had not succeeded.
    ok, broken = f"ok:{event.event_id}", f"broken:{event.event_id}"
    assert calls.calls == [ok, broken, broken]
    assert (await outbox_row(Session, event.event_id)).status == "processed"
    assert calls.dead == [(event.event_id, "always down")]
    statuses = {
        d.handler: (d.status, d.attempts) for d in await deliveries(Session, event.event_id)
    }
    assert statuses == {
        "tests.test_outbox.Calls.ok": ("succeeded", 1),
        "tests.test_outbox.Calls.broken": ("dead_letter", 2),
    }


async def test_a_drain_whose_bookkeeping_meets_a_lost_database_is_tried_again(
    Session: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery record a drain writes between two routes fails as a restarting server
    fails it: the step is retried a second later, not given up (the event would stay
    unrouted for good), and the retry routes the event."""
    registry = use(retry_backoff_seconds=1)
    calls = Calls()
    registry.register("order.placed", calls.ok)
    registry.register("order.placed", calls.flaky)
    record = DeliveryLog.record
    losses = [OperationalError("INSERT ...", None, ConnectionError("server closed"))]

    async def lost_once(self: DeliveryLog, deliveries: list[Delivery]) -> None:
        if losses:
            raise losses.pop()
        await record(self, deliveries)

    monkeypatch.setattr(DeliveryLog, "record", lost_once)
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.next_step, row.attempts) == ("pending", "route", 1)
    assert row.last_error is not None and "server closed" in row.last_error
    await move_clock(Session, timedelta(seconds=2))
    assert await drain(Session) == 1
    assert (await outbox_row(Session, event.event_id)).status == "processed"
    statuses = {d.handler: d.status for d in await deliveries(Session, event.event_id)}
    assert statuses == {
        "tests.test_outbox.Calls.ok": "succeeded",
        "tests.test_outbox.Calls.flaky": "succeeded",
    }


async def test_a_handler_that_loses_its_database_is_retried_not_dead_lettered(
    Session: Sessions,
) -> None:
    """The second route's handler finds its connection terminated by the server (as a
    restart does): a rule keyed on the first route would dead-letter it (that one succeeded);
    an outage is not the event's fault, so the drain is tried again a second later."""
    registry = use(retry_backoff_seconds=1)
    calls = Calls()
    registry.register("order.placed", calls.ok)
    registry.register("order.placed", loses_its_database_once(Session, calls))
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.next_step, row.attempts) == ("pending", "route", 1)
    assert row.last_error is not None and "terminating connection" in row.last_error
    await move_clock(Session, timedelta(seconds=2))
    assert await drain(Session) == 1
    assert (await outbox_row(Session, event.event_id)).status == "processed"
    assert calls.calls == [f"ok:{event.event_id}", f"db:{event.event_id}"]
    statuses = {d.handler: d.status for d in await deliveries(Session, event.event_id)}
    assert list(statuses.values()) == ["succeeded", "succeeded"]


async def test_publish_sync_whose_handler_loses_its_database_leaves_the_event_to_a_drain(
    Session: Sessions,
) -> None:
    """publish_sync raises the outage to its caller; the event is stored, in hand for the
    claim TTL as when a publisher dies mid-route, and then a drain routes it."""
    registry = use(outbox_claim_ttl_seconds=60)
    calls = Calls()
    registry.register("order.placed", calls.ok)
    registry.register("order.placed", loses_its_database_once(Session, calls))
    event = placed()
    with pytest.raises(OperationalError):
        await registry.publish_sync(event)
    assert (await outbox_row(Session, event.event_id)).status == "pending"
    assert await drain(Session) == 0  # still in hand
    await move_clock(Session, timedelta(seconds=61))
    assert await drain(Session) == 1
    assert (await outbox_row(Session, event.event_id)).status == "processed"
    assert calls.calls == [f"ok:{event.event_id}", f"db:{event.event_id}"]


async def test_handler_retries_happen_inside_one_drain(Session: Sessions) -> None:
    registry = use(max_retries=3)
    calls = Calls()
    calls.failures_left = 2
    registry.register("order.placed", calls.flaky, retries=2)
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    assert len(calls.calls) == 3
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts) == ("processed", 0)
    [delivery] = await deliveries(Session, event.event_id)
    assert (delivery.status, delivery.attempts) == ("succeeded", 3)


async def test_a_handler_past_the_running_timeout_fails(Session: Sessions) -> None:
    registry = use(delivery_running_timeout_seconds=1, max_retries=5)

    async def slow(event: WorkflowEvent) -> None:
        await asyncio.Event().wait()  # never set: only the running timeout ends it

    registry.register("order.placed", slow)
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert row.status == "failed"
    assert row.error is not None and "ran longer than 1 s" in row.error


# Outbox attempts, backoff and dead letters


async def test_a_failed_drain_backs_off_by_attempts(Session: Sessions) -> None:
    registry = use(max_retries=4, retry_backoff_seconds=7)
    calls = Calls()
    registry.register("order.placed", calls.broken)
    event = placed()
    await registry.publish(event)
    for attempt in (1, 2, 3):
        assert await drain(Session) == 1
        row = await outbox_row(Session, event.event_id)
        assert (row.status, row.route_attempts) == ("failed", attempt)
        assert row.error is not None and "ConnectionError: always down" in row.error
        assert row.wake_at is not None and row.settled_at is not None
        # wake_at and settled_at are both on the database clock (moved).
        backoff = (row.wake_at - row.settled_at).total_seconds()
        assert 7 * attempt - 1 < backoff <= 7 * attempt + 0.5
        assert await drain(Session) == 0  # not due before its backoff
        await move_clock(Session, timedelta(seconds=7 * attempt + 1))
    assert [d.status for d in await deliveries(Session, event.event_id)] == ["failed"]


async def test_the_last_retry_moves_the_row_to_dead_letter(Session: Sessions) -> None:
    registry = use(max_retries=2, retry_backoff_seconds=1)
    calls = Calls()
    registry.register("order.placed", calls.broken, dead_letter=calls.dead_letter)
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    assert calls.dead == []  # not dead yet: it will be retried
    await move_clock(Session, timedelta(seconds=2))
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts, row.next_step) == ("dead_letter", 2, None)
    assert calls.dead == [(event.event_id, "always down")]
    [delivery] = await deliveries(Session, event.event_id)
    assert (delivery.status, delivery.attempts) == ("dead_letter", 2)
    await move_clock(Session, timedelta(days=1))
    assert await drain(Session) == 0


async def test_with_dead_letters_off_the_row_stays_failed_and_due_again(
    Session: Sessions,
) -> None:
    registry = use(max_retries=1, retry_backoff_seconds=1, dead_letter_enabled=False)
    calls = Calls()
    registry.register("order.placed", calls.broken, dead_letter=calls.dead_letter)
    event = placed()
    await registry.publish(event)
    for attempt in (1, 2, 3):
        assert await drain(Session) == 1
        row = await outbox_row(Session, event.event_id)
        assert (row.status, row.route_attempts, row.next_step) == ("failed", attempt, "route")
        await move_clock(Session, timedelta(seconds=attempt + 1))
    assert calls.dead == []


async def test_max_retries_zero_dead_letters_at_once(Session: Sessions) -> None:
    registry = use(max_retries=0)
    calls = Calls()
    registry.register("order.placed", calls.broken)
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts) == ("dead_letter", 1)


async def test_a_successful_route_makes_the_row_processed_and_the_failure_dead(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.broken, dead_letter=calls.dead_letter)
    registry.register("order.placed", calls.ok)
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts) == ("processed", 0)
    assert row.error is not None and "always down" in row.error
    assert calls.dead == [(event.event_id, "always down")]
    assert [d.status for d in await deliveries(Session, event.event_id)] == [
        "dead_letter",
        "succeeded",
    ]


async def test_a_validator_refusal_is_dead_lettered_at_once(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register(
        "order.placed", calls.ok, validator=lambda e: False, dead_letter=calls.dead_letter
    )
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts, row.next_step) == ("dead_letter", 0, None)
    assert calls.calls == []
    assert len(calls.dead) == 1 and "refused" in calls.dead[0][1]
    [delivery] = await deliveries(Session, event.event_id)
    assert (delivery.status, delivery.attempts) == ("dead_letter", 0)


def _raise(exc: Exception) -> Any:
    raise exc


async def test_a_predicate_exception_is_an_outbox_failure(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok, when=lambda e: _raise(KeyError("tier")))
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts) == ("failed", 1)
    assert row.error is not None and "KeyError" in row.error
    assert calls.calls == []


async def test_a_retry_on_exception_is_an_outbox_failure(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register(
        "order.placed", calls.broken, retries=2, retry_on=lambda exc: _raise(ValueError("?"))
    )
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts) == ("failed", 1)
    assert row.error is not None and "ValueError: ?" in row.error


async def test_a_dead_letter_handler_exception_is_an_outbox_failure(Session: Sessions) -> None:
    registry = use(max_retries=3)
    calls = Calls()

    def broken_dead_letter(event: WorkflowEvent, error: BaseException) -> None:
        raise RuntimeError("pager down")

    registry.register(
        "order.placed", calls.ok, validator=lambda e: False, dead_letter=broken_dead_letter
    )
    event = placed()
    await registry.publish(event)
    assert await drain(Session) == 1
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts) == ("failed", 1)
    assert row.error is not None and "dead-letter handler" in row.error
    [delivery] = await deliveries(Session, event.event_id)
    assert delivery.status == "failed"  # its dead-letter handling is still owed


async def test_a_row_without_applicable_routes_is_processed(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok, when=lambda e: False)
    first, second = placed(), WorkflowEvent("order.cancelled", "cancelled", {})
    await registry.publish_many([first, second])
    assert await drain(Session) == 2
    for event in (first, second):
        assert (await outbox_row(Session, event.event_id)).status == "processed"
    assert await count(Session, app.Delivery) == 0
    assert calls.calls == []


# Replay


async def test_replay_runs_dead_routes_again_but_not_succeeded_ones(Session: Sessions) -> None:
    registry = use(max_retries=1)
    calls = Calls()
    registry.register("order.placed", calls.ok, when=lambda e: e.payload.get("both", False))
    registry.register("order.placed", calls.flaky)
    calls.failures_left = 1
    event = placed(both=False)
    await registry.publish(event)
    assert await drain(Session) == 1
    assert (await outbox_row(Session, event.event_id)).status == "dead_letter"
    assert await registry.replay_dead_letters() == [event.event_id]
    row = await outbox_row(Session, event.event_id)
    assert (row.status, row.route_attempts, row.next_step) == ("pending", 0, "route")
    assert await drain(Session) == 1
    assert (await outbox_row(Session, event.event_id)).status == "processed"
    assert calls.calls == [f"flaky:{event.event_id}"] * 2
    assert await registry.replay_dead_letters() == []


async def test_replay_by_id_touches_only_dead_rows_named(Session: Sessions) -> None:
    registry = use(max_retries=0)
    calls = Calls()
    registry.register("order.placed", calls.broken)
    dead_a, dead_b, live = placed("a"), placed("b"), placed("c")
    await registry.publish_many([dead_a, dead_b])
    assert await drain(Session) == 2
    await registry.publish(live)
    assert await registry.replay_dead_letters(["a", "c", "missing"]) == ["a"]
    assert (await outbox_row(Session, "b")).status == "dead_letter"
    assert (await outbox_row(Session, "c")).status == "pending"
    # Replay with a failing route dead-letters it again; succeeded routes are not involved.
    assert await drain(Session) == 2
    assert (await outbox_row(Session, "a")).status == "dead_letter"


# Batching


async def test_delivery_rows_are_written_in_chunks(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    engine = current_connection().autocommit
    table = app.Delivery.__table__
    log = delivery_log(engine.execution_options(), table, 3)  # type: ignore[arg-type]
    route = registry.register("order.placed", Calls().ok)
    rows = [Delivery.of(f"e{n}", route, "succeeded", 1, None) for n in range(7)]
    await asyncio.gather(*(log.record([row]) for row in rows))
    assert await count(Session, app.Delivery) == 7
    assert log.statements == 3  # 1 alone, then 6 gathered while it ran: two of 3


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_drains_deliveries_duplicates_and_claims_are_counted(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    registry.register("order.placed", calls.broken)
    before = {
        "processed": sample("duly_outbox_settled_total", status="processed"),
        "succeeded": sample("duly_outbox_deliveries_total", status="succeeded"),
        "dead": sample("duly_outbox_deliveries_total", status="dead_letter"),
        "duplicates": sample("duly_event_duplicates_total", registry="database"),
        "timed": sample("duly_outbox_route_seconds_count"),
        "claims": sample("duly_claim_rows_sum", workflow="duly_outbox"),
    }
    event = placed()
    await registry.publish_many([event, event, placed()])
    assert await drain(Session) == 2
    assert sample("duly_outbox_settled_total", status="processed") == before["processed"] + 2
    assert sample("duly_outbox_deliveries_total", status="succeeded") == before["succeeded"] + 2
    assert sample("duly_outbox_deliveries_total", status="dead_letter") == before["dead"] + 2
    assert sample("duly_event_duplicates_total", registry="database") == before["duplicates"] + 1
    assert sample("duly_outbox_route_seconds_count") == before["timed"] + 2
    assert sample("duly_claim_rows_sum", workflow="duly_outbox") == before["claims"] + 2


async def test_drains_write_delivery_rows_not_attempt_log_rows(
    Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    calls = Calls()
    registry.register("order.placed", calls.ok)
    await registry.publish_many([placed(), placed()])
    async with connect_workflows(Session):
        order = app.Order(reference="logged")
        assert await order.start(app.Order.place)
    assert await drain(Session) == 3
    assert await count(Session, app.Delivery) == 2
    async with Session() as session:
        logged = (await session.execute(select(app.Log.workflow))).scalars().all()
    assert logged == ["orders"]
