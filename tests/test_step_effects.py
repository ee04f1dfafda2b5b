"""A step's effects commit with the step (`engine.model.effects`): an event it publishes, a
run it starts and rows it writes through `step_session()` exist exactly when its commit does.

- a body that raises after its effects leaves none of them:
  test_a_step_that_raises_leaves_none_of_its_effects
- a commit fenced because the run moved meanwhile leaves none:
  test_a_fenced_commit_leaves_none_of_its_effects
- a step that commits leaves each once, and its started run and event go on:
  test_a_step_that_commits_leaves_each_effect_once
- the session's rows, the event and the run roll back together when the database refuses
  one of them: test_an_effect_the_database_refuses_fails_the_attempt_whole
- outside a step, publish and start commit on their own as before, and step_session()
  refuses: test_outside_a_step_effects_commit_on_their_own
- many effects gathered at once share the one transaction:
  test_effects_gathered_at_once_share_one_transaction
- a run started in a step comes due at the step's commit, not when its transaction began:
  test_a_run_started_in_a_step_comes_due_at_its_commit
- an outbox handler's start commits on its own, as before (its delivery is recorded as it
  goes): test_an_outbox_handlers_start_commits_on_its_own
- the events guide's step that publishes (docs/how-to/events.md), run as written, leaves all
  three effects or none: test_the_guides_step_that_publishes_is_atomic
(Across worker processes and a kill -9: tests/processes/test_effects_processes.py.)
"""

from __future__ import annotations

import asyncio
import importlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DatabaseEventRegistry,
    EventSettings,
    NotInStepError,
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
    step_session,
)
from engine.testing import drain
from tests.apps import effects
from tests.apps.effects import Charge, Gathered, Lingering, Parcel, Refused
from tests.conftest import Database
from tests.helpers import REPO_ROOT

WORKFLOWS = [Charge, Parcel]
EVENTS, OUTBOX = effects.Event.__tablename__, effects.Outbox.__tablename__


async def charged(db: Database, mode: str, n: int = 1) -> async_sessionmaker[AsyncSession]:
    Session = await db.create(effects.Base.metadata)
    async with connect_workflows(Session, workflows=WORKFLOWS):
        for i in range(n):
            assert await Charge(reference=f"c{i}", mode=mode).start(Charge.settle)
    return Session


def counts(db: Database) -> tuple[int, int, int]:
    """(events, parcels, receipts) in the database."""
    [(events, parcels, receipts)] = db.sql(
        f"SELECT (SELECT count(*) FROM {EVENTS}), (SELECT count(*) FROM parcels), "
        "(SELECT count(*) FROM receipts)"
    )
    return events, parcels, receipts


async def test_a_step_that_raises_leaves_none_of_its_effects(db: Database) -> None:
    Session = await charged(db, "raise")
    assert await drain(Session, WORKFLOWS) == 1
    assert counts(db) == (0, 0, 0)
    assert db.sql("SELECT status, next_step, last_error FROM charges") == [
        ("new", None, "RuntimeError: the card was declined after the effects")
    ]
    assert db.sql(f"SELECT count(*) FROM {OUTBOX}") == [(0,)]


async def test_a_fenced_commit_leaves_none_of_its_effects(db: Database) -> None:
    Session = await charged(db, "move")
    assert await drain(Session, WORKFLOWS) == 1
    assert counts(db) == (0, 0, 0)
    # The operator's cancel stands; the step's own changes were fenced with its effects.
    assert db.sql("SELECT status, next_step, last_error FROM charges") == [
        ("new", None, "cancelled")
    ]


async def test_a_step_that_commits_leaves_each_effect_once(db: Database) -> None:
    Session = await charged(db, "ok", n=3)
    # Three settles, then the three parcels they started (kicked once their commit landed;
    # a parcel committed after the drain's last pass waits for the next drain).
    steps = await drain(Session, WORKFLOWS)
    steps += await drain(Session, WORKFLOWS)
    assert steps == 6
    assert counts(db) == (3, 3, 3)
    assert db.sql("SELECT status FROM charges") == [("settled",)] * 3
    assert db.sql("SELECT reference, next_step FROM parcels ORDER BY reference") == [
        ("c0", None),
        ("c1", None),
        ("c2", None),
    ]
    assert db.sql("SELECT charge FROM receipts ORDER BY charge") == [("c0",), ("c1",), ("c2",)]
    # Each event's outbox row is queued, due for a drain.
    assert db.sql(f"SELECT count(*) FROM {OUTBOX} WHERE wake_at IS NOT NULL") == [(3,)]


async def test_an_effect_the_database_refuses_fails_the_attempt_whole(db: Database) -> None:
    Session = await db.create(effects.Base.metadata)
    db.sql("INSERT INTO receipts (id, charge) VALUES (1, 'taken')")
    async with connect_workflows(Session, workflows=[Refused, Parcel]):
        assert await Refused(id=7).start(Refused.go)
    assert await drain(Session, [Refused, Parcel]) == 1
    assert counts(db) == (0, 0, 1)
    [(last_error,)] = db.sql("SELECT last_error FROM refused")
    assert last_error.startswith("IntegrityError")


async def test_outside_a_step_effects_commit_on_their_own(db: Database) -> None:
    Session = await db.create(effects.Base.metadata)
    async with connect_workflows(Session, workflows=WORKFLOWS):
        await effects.registry.publish(WorkflowEvent("charge.settled"))
        assert await Parcel(reference="outside").start(Parcel.pack)
        assert counts(db) == (1, 1, 0)
        with pytest.raises(NotInStepError):
            async with step_session():
                pass


async def test_effects_gathered_at_once_share_one_transaction(db: Database) -> None:
    Session = await db.create(effects.Base.metadata)
    async with connect_workflows(Session, workflows=[Gathered, Parcel]):
        assert await Gathered(id=1).start(Gathered.go)
    assert await drain(Session, [Gathered]) == 1
    assert counts(db) == (5, 5, 0)
    assert db.sql("SELECT next_step, last_error FROM gathered") == [(None, None)]


def guide_example() -> dict[str, Any]:
    """The events guide's step that publishes and the app module it imports, as written."""
    text = GUIDE.read_text()
    folder = Path(tempfile.mkdtemp(prefix="duly-guide-"))
    for path in GUIDE_FILES:  # a later block with the same path replaces the file
        opening = f'```python title="{path}"\n'
        start = text.rindex(opening) + len(opening)
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text[start : text.index("```\n", start)])
    sys.path.insert(0, str(folder / "src"))
    try:
        app = importlib.import_module("shipping.app")
        shipments = importlib.import_module("shipping.shipments")
    finally:
        sys.path.remove(str(folder / "src"))
        shutil.rmtree(folder)  # imported: the modules no longer need their files
    return {
        "module": shipments,
        "Base": app.Base,
        "Shipment": shipments.Shipment,
        "Invoice": shipments.Invoice,
        "events_table": app.engine_tables.event.__tablename__,
    }


GUIDE = REPO_ROOT / "docs" / "how-to" / "events.md"
GUIDE_FILES = ("src/shipping/app.py", "src/shipping/shipments.py")
EXAMPLE = guide_example()


@pytest.mark.parametrize("carrier_fails", [True, False])
async def test_the_guides_step_that_publishes_is_atomic(
    db: Database, carrier_fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    booked: list[int] = []

    async def book_carrier(shipment_id: int) -> None:
        if carrier_fails:
            raise ConnectionError("the carrier is down")
        booked.append(shipment_id)

    monkeypatch.setattr(EXAMPLE["module"], "book_carrier", book_carrier)
    Shipment, Invoice = EXAMPLE["Shipment"], EXAMPLE["Invoice"]
    Session = await db.create(EXAMPLE["Base"].metadata)
    async with connect_workflows(Session, workflows=[Shipment, Invoice]):
        assert await Shipment(id=1).start(Shipment.ship)
    await drain(Session, [Shipment, Invoice])
    [(events,)] = db.sql(f"SELECT count(*) FROM {EXAMPLE['events_table']}")
    [(invoices, labels)] = db.sql(
        "SELECT (SELECT count(*) FROM shipping_invoices), (SELECT count(*) FROM shipping_labels)"
    )
    [(status, attempts)] = db.sql("SELECT status, attempts FROM outgoing_shipments")
    if carrier_fails:  # its attempt failed (a retry is due later): none of the three happened
        assert (events, invoices, labels, status, attempts) == (0, 0, 0, "new", 1)
    else:
        assert (events, invoices, labels, status, booked) == (1, 1, 1, "shipped", [1])


async def test_a_run_started_in_a_step_comes_due_at_its_commit(db: Database) -> None:
    Lingering.started, Lingering.go_on = asyncio.Event(), asyncio.Event()
    Session = await db.create(effects.Base.metadata)
    async with connect_workflows(Session, workflows=[Lingering, Parcel]):
        assert await Lingering(id=1).start(Lingering.go)
    draining = asyncio.create_task(drain(Session, [Lingering]))
    await asyncio.wait_for(Lingering.started.wait(), 10)
    [(body_still_running_at,)] = db.sql("SELECT clock_timestamp()")
    Lingering.go_on.set()
    assert await draining == 1
    # Not the time its transaction began: a worker's claim floor may have passed that.
    [(wake_at,)] = db.sql("SELECT wake_at FROM parcels")
    assert wake_at > body_still_running_at


async def test_an_outbox_handlers_start_commits_on_its_own(db: Database) -> None:
    """A handler records its delivery as it goes: what it starts must not wait for (and fall
    with) the route step's commit, which here is fenced by a move of the outbox row."""
    chosen = DatabaseEventRegistry(
        outbox=effects.Outbox, settings=EventSettings(async_delivery=True)
    )

    calls: list[bool] = []

    async def start_parcel(event: WorkflowEvent) -> None:
        calls.append(await Parcel(reference=event.event_id).start(Parcel.pack))
        if len(calls) == 1:  # the row moves meanwhile: this route's commit is fenced
            db.sql(f"UPDATE {OUTBOX} SET wf_version = wf_version + 1")

    chosen.register("charge.settled", start_parcel)
    configure_event_registry(chosen)
    try:
        Session = await db.create(effects.Base.metadata)
        async with connect_workflows(Session, workflows=[Parcel]):
            await chosen.publish(WorkflowEvent("charge.settled", event_id="e1"))
        await drain(Session, [effects.Outbox])
    finally:
        configure_event_registry(None)
    # The parcel stands though its route's commit was fenced; the route ran again (a handler
    # is at least once) and found it started.
    assert db.sql("SELECT reference FROM parcels") == [("e1",)]
    assert calls == [True, False]
