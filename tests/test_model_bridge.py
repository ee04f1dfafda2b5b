"""The model-change bridge (`engine.events.bridge`), on the real PostgreSQL: one test per rule.

The seed's "Signal bridge", sentence by sentence, and the test that shows it here:

- "When ... WORKFLOW_SIGNAL_BRIDGE = True, manager create, update, and delete
  signals are converted into workflow events":
  test_connect_bridge_from_settings_connects_only_when_signal_bridge_is_on,
  test_a_created_row_lands_in_the_outbox_in_the_same_transaction,
  test_an_update_publishes_the_changed_fields_with_old_values_from_history,
  test_a_delete_publishes_with_only_identification.
- "Nested GENERAL_MANAGER[...] takes precedence ... values are interpreted
  with bool(...)": Django settings; here EventSettings reads
  DULY_SIGNAL_BRIDGE (tests/test_event_settings.py).
- "a stable dispatch uid ...; disconnecting removes that receiver":
  test_connect_and_disconnect_are_idempotent.
- "The receiver ignores the Django signal sender and uses instance ...":
  Django-bound; the flush's own rows are the instances
  (test_an_orphan_removed_by_delete_orphan_publishes_a_deletion).
- "Only GeneralManager instances are converted": test_only_opted_in_models_publish.
- "unknown action values are ignored": test_unknown_actions_are_ignored.
- "Create and update signals require at least one changed field after
  reserved signal keys and private keys are removed":
  test_an_update_that_changes_no_column_publishes_nothing,
  test_a_create_that_sets_no_field_publishes_nothing,
  test_private_attributes_are_never_published.
- "Delete signals can publish with only identification":
  test_a_delete_publishes_with_only_identification.
- "Events use the manager class name, identification ..., source ...,
  metadata {"action": action}, and the ... helper defaults for event ids and
  timestamps": test_a_created_row_lands_in_the_outbox_in_the_same_transaction,
  test_identification_is_the_primary_key_by_attribute_name.
- "Update events receive old_relevant_values; when an old value is missing
  ... leaves the old value as None":
  test_an_update_publishes_the_changed_fields_with_old_values_from_history,
  test_an_old_value_never_loaded_is_none.
- "Exceptions from event registry publishing propagate to the signal caller":
  test_a_failing_publish_fails_the_flush,
  test_a_value_that_is_not_json_fails_the_flush.

And what the outbox adds (the same transaction as the change):
test_a_rolled_back_transaction_publishes_nothing,
test_a_rolled_back_savepoint_drops_only_its_own_events,
test_each_flush_publishes_its_own_changes_once,
test_dates_decimals_and_datetimes_are_published_as_text,
test_with_another_registry_changes_are_skipped_with_a_warning,
test_a_drain_routes_a_bridged_event_to_its_handler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Connection, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DatabaseEventRegistry,
    EventError,
    EventSettings,
    InMemoryEventRegistry,
    WorkflowEvent,
    configure_event_registry,
)
from engine.events import bridge
from engine.events.bridge import (
    bridge_connected,
    connect_bridge,
    connect_bridge_from_settings,
    disconnect_bridge,
    model_change_event,
)
from engine.testing import drain
from tests.apps.bridge import BridgeBase, BridgeOutbox, Crate, Parcel, Route, Scan, Stop
from tests.conftest import Database

Sessions = async_sessionmaker[AsyncSession]
PUBLISHED = """
    SELECT o.event_type, o.event_name, e.source, e.payload, e.metadata, o.status
    FROM bridge_events e JOIN bridge_outbox o USING (event_id)
    ORDER BY e.occurred_at, e.event_id
"""


@pytest.fixture
async def Session(db: Database) -> Sessions:
    return await db.create(BridgeBase.metadata)


@pytest.fixture
def registry() -> Iterator[DatabaseEventRegistry]:
    """A database registry writing the bridge's outbox, configured and bridged."""
    chosen = DatabaseEventRegistry(outbox=BridgeOutbox, settings=EventSettings())
    configure_event_registry(chosen)
    connect_bridge()
    yield chosen
    disconnect_bridge()
    configure_event_registry(None)


def published(db: Database) -> list[tuple[Any, ...]]:
    """The committed events: (type, name, source, payload, metadata, outbox status)."""
    return db.sql(PUBLISHED)


def payloads(db: Database) -> list[dict[str, Any]]:
    """The committed events' payloads, oldest first."""
    return [row[3] for row in published(db)]


async def add_parcel(Session: Sessions, **values: Any) -> Parcel:
    """A parcel committed (and its created event with it)."""
    async with Session() as session:
        parcel = Parcel(**values)
        session.add(parcel)
        await session.commit()
    return parcel


async def test_a_created_row_lands_in_the_outbox_in_the_same_transaction(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        parcel = Parcel(address="1 Main St")
        session.add(parcel)
        await session.flush()
        in_transaction = await session.scalar(select(func.count()).select_from(BridgeOutbox))
        assert in_transaction == 1, "written by the flush, in the flush's transaction"
        assert published(db) == [], "not visible to anyone else before the commit"
        await session.commit()

    assert published(db) == [
        (
            "duly.model.created",
            "model_created",
            "duly.bridge",
            {
                "model": "Parcel",
                "values": {"address": "1 Main St"},
                "identification": {"id": parcel.id},
            },
            {"action": "created"},
            "pending",
        )
    ]


async def test_an_update_publishes_the_changed_fields_with_old_values_from_history(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    parcel = await add_parcel(Session, address="1 Main St", status="packed")
    async with Session() as session:
        stored = await session.get_one(Parcel, parcel.id)
        stored.address = "2 High St"
        stored.status = "packed"  # the same value: not a change
        await session.commit()

    assert payloads(db)[1:] == [
        {
            "model": "Parcel",
            "changes": {"address": {"old": "1 Main St", "new": "2 High St"}},
            "identification": {"id": parcel.id},
        }
    ]
    assert published(db)[1][4] == {"action": "updated"}


async def test_an_old_value_never_loaded_is_none(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    parcel = await add_parcel(Session, address="1 Main St")
    async with Session() as session:
        stored = await session.get_one(Parcel, parcel.id)
        session.expire(stored, ["address"])  # unloaded: set without reading it
        stored.address = "2 High St"
        await session.commit()

    assert payloads(db)[1]["changes"] == {"address": {"old": None, "new": "2 High St"}}


async def test_a_delete_publishes_with_only_identification(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    parcel = await add_parcel(Session, address="1 Main St")
    async with Session() as session:
        await session.delete(await session.get_one(Parcel, parcel.id))
        await session.commit()

    deleted = published(db)[1]
    assert deleted[:3] == ("duly.model.deleted", "model_deleted", "duly.bridge")
    assert deleted[3] == {"model": "Parcel", "identification": {"id": parcel.id}}
    assert deleted[4] == {"action": "deleted"}


async def test_a_rolled_back_transaction_publishes_nothing(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        session.add(Parcel(address="1 Main St"))
        await session.flush()
        await session.rollback()

    assert published(db) == []
    assert db.sql("SELECT count(*) FROM bridge_events") == [(0,)]


async def test_a_rolled_back_savepoint_drops_only_its_own_events(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        session.add(Parcel(address="kept"))
        await session.flush()
        savepoint = await session.begin_nested()
        session.add(Parcel(address="dropped"))
        await session.flush()
        await savepoint.rollback()
        await session.commit()

    assert [p["values"] for p in payloads(db)] == [{"address": "kept"}]


async def test_each_flush_publishes_its_own_changes_once(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        parcel = Parcel(address="1 Main St")
        session.add(parcel)
        await session.flush()
        parcel.status = "packed"
        await session.flush()
        await session.flush()  # nothing new: nothing published
        await session.commit()

    assert [(row[0], row[3]) for row in published(db)] == [
        (
            "duly.model.created",
            {
                "model": "Parcel",
                "values": {"address": "1 Main St"},
                "identification": {"id": parcel.id},
            },
        ),
        (
            "duly.model.updated",
            {
                "model": "Parcel",
                "changes": {"status": {"old": "new", "new": "packed"}},
                "identification": {"id": parcel.id},
            },
        ),
    ]


async def test_an_update_that_changes_no_column_publishes_nothing(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    parcel = await add_parcel(Session, address="1 Main St")
    async with Session() as session:
        stored = await session.get_one(Parcel, parcel.id)
        stored.address = "1 Main St"
        assert stored in session.dirty, "the ORM flushes it as dirty all the same"
        await session.commit()

    assert len(published(db)) == 1, "only the create"


async def test_a_create_that_sets_no_field_publishes_nothing(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        session.add(Parcel())  # every column from its default: no field set
        await session.commit()

    assert db.sql("SELECT count(*) FROM bridge_parcels") == [(1,)]
    assert published(db) == []


async def test_private_attributes_are_never_published(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    parcel = await add_parcel(Session, address="1 Main St", _courier_note="ring twice")
    async with Session() as session:
        stored = await session.get_one(Parcel, parcel.id)
        stored._courier_note = "leave at the door"  # a private change alone: no event
        await session.commit()

    assert payloads(db) == [
        {
            "model": "Parcel",
            "values": {"address": "1 Main St"},
            "identification": {"id": parcel.id},
        }
    ]
    assert db.sql("SELECT courier_note FROM bridge_parcels") == [("leave at the door",)]


async def test_only_opted_in_models_publish(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        session.add(Crate(label="fragile"))
        session.add(Parcel(address="1 Main St"))
        await session.commit()

    assert [p["model"] for p in payloads(db)] == ["Parcel"]


async def test_unknown_actions_are_ignored(Session: Sessions) -> None:
    parcel = Parcel(id=7, address="1 Main St")
    assert model_change_event("archived", parcel) is None
    created = model_change_event("created", parcel)
    assert isinstance(created, WorkflowEvent) and created.event_type == "duly.model.created"


async def test_identification_is_the_primary_key_by_attribute_name(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        session.add(Stop(route=Route(name="north"), seq=1, place="depot"))
        await session.commit()

    (created,) = payloads(db)
    route_id = created["identification"]["route_id"]
    assert created == {
        "model": "Stop",
        "values": {"route_id": route_id, "seq": 1, "place": "depot"},
        "identification": {"route_id": route_id, "seq": 1},
    }
    async with Session() as session:
        found = await session.get(Stop, created["identification"])
        assert found is not None and found.place == "depot", "session.get takes it as it is"


async def test_an_orphan_removed_by_delete_orphan_publishes_a_deletion(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        route = Route(name="north", stops=[Stop(seq=1, place="a"), Stop(seq=2, place="b")])
        session.add(route)
        await session.commit()
    async with Session() as session:
        stored = await session.get_one(Route, route.id)
        stored.stops.pop(0)  # an orphan: deleted by the flush, never session.delete()d
        await session.commit()

    assert [(row[0], row[3]["identification"]["seq"]) for row in published(db)] == [
        ("duly.model.created", 1),
        ("duly.model.created", 2),
        ("duly.model.deleted", 1),
    ]


async def test_dates_decimals_and_datetimes_are_published_as_text(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    scanned = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
    await add_parcel(Session, weight=Decimal("1.250"), ship_on=date(2025, 3, 2), scanned_at=scanned)

    assert payloads(db)[0]["values"] == {
        "weight": "1.250",
        "ship_on": "2025-03-02",
        "scanned_at": "2025-03-01T09:30:00+00:00",
    }


class FailingRegistry(DatabaseEventRegistry):
    """A database registry whose publishing fails."""

    def publish_in(self, connection: Connection, events: Sequence[WorkflowEvent]) -> list[str]:
        raise RuntimeError("the outbox is full")


async def test_a_failing_publish_fails_the_flush(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    configure_event_registry(FailingRegistry(outbox=BridgeOutbox, settings=EventSettings()))
    async with Session() as session:
        session.add(Parcel(address="1 Main St"))
        with pytest.raises(RuntimeError, match="the outbox is full"):
            await session.commit()

    assert db.sql("SELECT count(*) FROM bridge_parcels") == [(0,)], "the change went with it"
    assert published(db) == []


async def test_a_value_that_is_not_json_fails_the_flush(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    async with Session() as session:
        session.add(Scan(image=b"\x89PNG"))
        with pytest.raises(EventError, match=r"Scan\.image: a bytes is not JSON"):
            await session.flush()

    assert db.sql("SELECT count(*) FROM bridge_scans") == [(0,)]


async def test_with_another_registry_changes_are_skipped_with_a_warning(
    db: Database,
    Session: Sessions,
    registry: DatabaseEventRegistry,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bridge, "_warned", set())
    configure_event_registry(InMemoryEventRegistry())
    with caplog.at_level(logging.WARNING, logger="duly.events"):
        for address in ("1 Main St", "2 High St"):
            await add_parcel(Session, address=address)

    assert db.sql("SELECT count(*) FROM bridge_parcels") == [(2,)], "the changes are kept"
    assert published(db) == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "duly.events"]
    assert len(warnings) == 1, "once per registry class"
    assert "InMemoryEventRegistry" in warnings[0]


async def test_connect_and_disconnect_are_idempotent(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    connect_bridge()
    connect_bridge()
    assert bridge_connected()
    await add_parcel(Session, address="1 Main St")
    assert len(published(db)) == 1, "connected three times, published once"

    disconnect_bridge()
    disconnect_bridge()
    assert not bridge_connected()
    await add_parcel(Session, address="2 High St")
    assert len(published(db)) == 1, "disconnected: nothing more"


async def test_connect_bridge_from_settings_connects_only_when_signal_bridge_is_on(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    disconnect_bridge()
    assert connect_bridge_from_settings(EventSettings.from_env({})) is False
    assert not bridge_connected()
    await add_parcel(Session, address="1 Main St")
    assert published(db) == []

    on = EventSettings.from_env({"DULY_SIGNAL_BRIDGE": "on"})
    assert connect_bridge_from_settings(on) is True
    assert bridge_connected()
    await add_parcel(Session, address="2 High St")
    assert [p["values"] for p in payloads(db)] == [{"address": "2 High St"}]


async def test_a_drain_routes_a_bridged_event_to_its_handler(
    db: Database, Session: Sessions, registry: DatabaseEventRegistry
) -> None:
    received: list[WorkflowEvent] = []

    async def on_update(event: WorkflowEvent) -> None:
        received.append(event)

    registry.register("model_updated", on_update, when=lambda e: e.payload["model"] == "Parcel")
    parcel = await add_parcel(Session, address="1 Main St")
    async with Session() as session:
        (await session.get_one(Parcel, parcel.id)).status = "shipped"
        await session.commit()

    assert await drain(Session, [BridgeOutbox]) == 2, "both events routed"

    assert [e.payload for e in received] == [
        {
            "model": "Parcel",
            "changes": {"status": {"old": "new", "new": "shipped"}},
            "identification": {"id": parcel.id},
        }
    ]
    assert received[0].source == "duly.bridge"
    assert [row[5] for row in published(db)] == ["processed", "processed"]
