"""The outbox routes of the deployable app over real HTTP, on a real database.

Events are published through a DatabaseEventRegistry and drained by the
engine's own worker (`engine.testing.drain`); the app reads and replays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, get_args

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
)
from engine.events import views
from engine.events.views import VIEW_STATUSES
from engine.testing import drain, move_clock
from functions.app import create_app
from functions.http.routes.outbox import OutboxStatus
from tests.apps import chain, outbox
from tests.conftest import Database
from tests.helpers import serving, wait_until

BACKOFF = timedelta(seconds=30)  # past DULY_RETRY_BACKOFF_SECONDS x the attempts so far
ZERO = {"pending": 0, "claimed": 0, "processed": 0, "failed": 0, "dead_letter": 0}


class Handlers:
    """The handlers the registry routes to, and what they did."""

    def __init__(self) -> None:
        self.shipped: list[str] = []
        self.provider_up = False
        self.release = asyncio.Event()
        self.registry = DatabaseEventRegistry(
            outbox=outbox.Outbox, settings=EventSettings(max_retries=2)
        )

    async def ship(self, event: WorkflowEvent) -> None:
        self.shipped.append(event.event_id)

    async def charge(self, event: WorkflowEvent) -> None:
        if not self.provider_up:
            raise ConnectionError("the payment provider is down")

    async def hold(self, event: WorkflowEvent) -> None:
        await self.release.wait()


@pytest.fixture
def handlers() -> Iterator[Handlers]:
    """A DatabaseEventRegistry configured for the test (two drains before dead letter)."""
    found = Handlers()
    registry = found.registry
    registry.register("order.placed", found.ship)
    registry.register("order.charged", found.charge)
    registry.register("order.held", found.hold)
    configure_event_registry(registry)
    try:
        yield found
    finally:
        configure_event_registry(None)


def event(event_type: str, event_id: str, **payload: Any) -> WorkflowEvent:
    return WorkflowEvent(event_type, event_type.replace(".", "_"), payload, event_id=event_id)


async def publish(Session: async_sessionmaker[AsyncSession], *events: WorkflowEvent) -> None:
    async with connect_workflows(Session, workflows=[outbox.Outbox]):
        registry = DatabaseEventRegistry(outbox=outbox.Outbox, settings=EventSettings())
        for one in events:  # one statement each: created_at orders them
            assert await registry.publish_many([one]) == [one.event_id]


async def drain_outbox(Session: async_sessionmaker[AsyncSession]) -> None:
    await drain(Session, [outbox.Outbox])


async def dead_letters(Session: async_sessionmaker[AsyncSession], *ids: str) -> None:
    """Publish order.charged events and drain them twice: dead-lettered."""
    await publish(Session, *(event("order.charged", i, order=i) for i in ids))
    await drain_outbox(Session)
    await move_clock(Session, BACKOFF)
    await drain_outbox(Session)


async def test_summary_counts_statuses_next_due_and_failing_handlers(
    db: Database, handlers: Handlers
) -> None:
    Session = await db.create(outbox.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        empty = (await client.get("/outbox")).json()
        assert (empty["counts"], empty["next_due_at"], empty["handlers"]) == (ZERO, None, [])

        await publish(
            Session,
            event("order.placed", "p1"),
            event("order.placed", "p2"),
            event("order.charged", "c1"),
        )
        published = (await client.get("/outbox")).json()
        assert published["counts"] == ZERO | {"pending": 3}
        assert datetime.fromisoformat(published["next_due_at"]) <= datetime.fromisoformat(
            published["now"]
        )

        await drain_outbox(Session)
        drained = (await client.get("/outbox")).json()
        assert drained["counts"] == ZERO | {"processed": 2, "failed": 1}
        # The failed row is due again after the backoff: that is the next due instant.
        assert datetime.fromisoformat(drained["next_due_at"]) > datetime.fromisoformat(
            drained["now"]
        )
        charge = f"{Handlers.__module__}.Handlers.charge"
        assert drained["handlers"] == [{"handler": charge, "failed": 1, "dead_letter": 0}]

        await move_clock(Session, BACKOFF)
        await drain_outbox(Session)
        dead = (await client.get("/outbox")).json()
        assert dead["counts"] == ZERO | {"processed": 2, "dead_letter": 1}
        assert dead["next_due_at"] is None
        assert dead["handlers"] == [{"handler": charge, "failed": 0, "dead_letter": 1}]

        # A row a worker holds is claimed while its handler runs.
        await publish(Session, event("order.held", "h1"))
        draining = asyncio.create_task(drain_outbox(Session))

        async def claimed() -> bool:
            return bool((await client.get("/outbox")).json()["counts"]["claimed"] == 1)

        try:
            await wait_until(claimed)
            held = (await client.get("/outbox/events", params={"status": "claimed"})).json()
            assert [row["event_id"] for row in held["events"]] == ["h1"]
            assert held["events"][0]["claimed_until"] is not None
        finally:
            handlers.release.set()
            await draining
        settled = (await client.get("/outbox")).json()["counts"]
    assert settled == ZERO | {"processed": 3, "dead_letter": 1}


async def test_events_are_listed_newest_first_by_status_a_page_at_a_time(
    db: Database, handlers: Handlers
) -> None:
    Session = await db.create(outbox.Base.metadata)
    await publish(Session, *(event("order.placed", f"p{n}") for n in range(5)))
    await drain_outbox(Session)
    await dead_letters(Session, "c1", "c2")
    await publish(Session, event("order.placed", "late"))
    async with serving(create_app(Session, run_worker=False)) as client:
        everything = (await client.get("/outbox/events")).json()
        assert [row["event_id"] for row in everything["events"]] == [
            "late", "c2", "c1", "p4", "p3", "p2", "p1", "p0",
        ]  # fmt: skip
        assert everything["next_before"] is None
        late = everything["events"][0]
        assert (late["status"], late["event_type"], late["route_attempts"]) == (
            "pending",
            "order.placed",
            0,
        )
        assert late["due_at"] is not None and late["settled_at"] is None

        dead = (await client.get("/outbox/events", params={"status": "dead_letter"})).json()
        assert [row["event_id"] for row in dead["events"]] == ["c2", "c1"]
        assert dead["events"][0]["error"].endswith("ConnectionError: the payment provider is down")
        assert dead["events"][0]["route_attempts"] == 2
        pending = (await client.get("/outbox/events", params={"status": "pending"})).json()
        assert [row["event_id"] for row in pending["events"]] == ["late"]

        pages: list[str] = []
        params: dict[str, Any] = {"status": "processed", "limit": 2}
        while True:
            page = (await client.get("/outbox/events", params=params)).json()
            pages.extend(row["event_id"] for row in page["events"])
            if page["next_before"] is None:
                break
            params["before"] = page["next_before"]
        assert pages == ["p4", "p3", "p2", "p1", "p0"]
        skipped = (await client.get("/outbox/events", params={"offset": 6, "limit": 5})).json()
        assert [row["event_id"] for row in skipped["events"]] == ["p1", "p0"]

        bad_status = await client.get("/outbox/events", params={"status": "lost"})
        bad_limit = await client.get("/outbox/events", params={"limit": 0})
        bad_offset = await client.get("/outbox/events", params={"offset": -1})
        # Past the bound a page goes on from `before`; 10**12 reached the database as a 4xx.
        far_offset = await client.get("/outbox/events", params={"offset": 10**12})
        schema = (await client.get("/openapi.json")).json()
        unknown_cursor = await client.get("/outbox/events", params={"before": "nope"})
    assert bad_status.status_code == 422
    assert bad_status.json()["detail"][0]["loc"] == ["query", "status"]
    assert (bad_limit.status_code, bad_offset.status_code) == (422, 422)
    assert far_offset.status_code == 422
    assert far_offset.json()["detail"][0]["loc"] == ["query", "offset"]
    [offset] = [
        p for p in schema["paths"]["/outbox/events"]["get"]["parameters"] if p["name"] == "offset"
    ]
    assert offset["schema"]["maximum"] == views.MAX_OUTBOX_OFFSET
    assert unknown_cursor.status_code == 404
    assert unknown_cursor.json() == {"detail": "No outbox row 'nope' to page from."}


def test_the_app_accepts_exactly_the_statuses_the_views_know() -> None:
    assert get_args(OutboxStatus) == VIEW_STATUSES


async def test_event_detail_shows_the_record_its_row_and_each_route(
    db: Database, handlers: Handlers
) -> None:
    Session = await db.create(outbox.Base.metadata)
    await publish(Session, event("order.placed", "p1", order=7, lines=["book"]))
    await drain_outbox(Session)
    await dead_letters(Session, "c1")
    async with serving(create_app(Session, run_worker=False)) as client:
        placed = (await client.get("/outbox/events/p1")).json()
        charged = (await client.get("/outbox/events/c1")).json()
        unknown = await client.get("/outbox/events/nope")
        nul = await client.get("/outbox/events/a%00b")
    assert placed["event"]["payload"] == {"order": 7, "lines": ["book"]}
    assert (placed["event"]["event_type"], placed["event"]["metadata"]) == ("order.placed", {})
    assert placed["outbox"]["status"] == "processed"
    [shipped] = placed["deliveries"]
    assert (shipped["handler"], shipped["status"], shipped["attempts"], shipped["error"]) == (
        f"{Handlers.__module__}.Handlers.ship",
        "succeeded",
        1,
        None,
    )
    assert charged["outbox"]["status"] == "dead_letter"
    [failed] = charged["deliveries"]
    assert (failed["status"], failed["attempts"], failed["event_key"]) == (
        "dead_letter",
        2,
        "order.charged",
    )
    assert failed["error"] == "ConnectionError: the payment provider is down"
    assert (unknown.status_code, unknown.json()) == (404, {"detail": "No event 'nope'."})
    assert nul.status_code == 400


async def test_dead_letters_are_replayed_one_chosen_or_all(
    db: Database, handlers: Handlers
) -> None:
    Session = await db.create(outbox.Base.metadata)
    await publish(Session, event("order.placed", "p1"))
    await dead_letters(Session, "c1", "c2", "c3", "c4")
    async with serving(create_app(Session, run_worker=False)) as client:
        one = await client.post("/outbox/events/c1/replay")
        assert (one.status_code, one.json()) == (200, {"replayed": ["c1"], "count": 1})
        assert (await client.get("/outbox/events/c1")).json()["outbox"]["status"] == "pending"
        again = await client.post("/outbox/events/c1/replay")
        processed = await client.post("/outbox/events/p1/replay")
        unknown = await client.post("/outbox/events/nope/replay")
        assert again.status_code == 409
        assert again.json()["detail"] == (
            "Event 'c1' is pending, not dead_letter: there is nothing to replay."
        )
        assert processed.status_code == 409
        assert unknown.status_code == 404

        chosen = await client.post(
            "/outbox/dead-letters/replay", json={"event_ids": ["c2", "p1", "nope"]}
        )
        assert chosen.json() == {"replayed": ["c2"], "count": 1}
        for body in ({"event_ids": "c3"}, {"ids": ["c3"]}, {"event_ids": [""]}):
            refused = await client.post("/outbox/dead-letters/replay", json=body)
            assert refused.status_code == 422, body
        none = await client.post("/outbox/dead-letters/replay", json={"event_ids": []})
        assert none.json() == {"replayed": [], "count": 0}

        # No registry configured: the app replays through one of its own.
        configure_event_registry(None)
        rest = await client.post("/outbox/dead-letters/replay")
        assert rest.status_code == 200
        assert sorted(rest.json()["replayed"]) == ["c3", "c4"]
        assert rest.json()["count"] == 2
        assert (await client.post("/outbox/dead-letters/replay", json={})).json()["count"] == 0
        counts = (await client.get("/outbox")).json()["counts"]
        assert counts == ZERO | {"pending": 4, "processed": 1}
        # The dead routes are failed again, so the summary counts them as owed.
        charge = f"{Handlers.__module__}.Handlers.charge"
        handler_counts = (await client.get("/outbox")).json()["handlers"]
        assert handler_counts == [{"handler": charge, "failed": 4, "dead_letter": 0}]

    handlers.provider_up = True
    configure_event_registry(handlers.registry)
    await drain_outbox(Session)
    rows = db.sql("SELECT event_id, status FROM duly_outbox ORDER BY event_id")
    assert rows == [(i, "processed") for i in ("c1", "c2", "c3", "c4", "p1")]


async def test_outbox_routes_answer_404_when_the_database_has_no_outbox(db: Database) -> None:
    Session = await db.create(chain.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        replies = [
            await client.get("/outbox"),
            await client.get("/outbox/events"),
            await client.get("/outbox/events/e1"),
            await client.post("/outbox/dead-letters/replay"),
            await client.post("/outbox/events/e1/replay"),
        ]
    for reply in replies:
        assert reply.status_code == 404, reply.text
        assert reply.json()["detail"].startswith("This database has no outbox table: map ")
