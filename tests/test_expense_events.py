"""The example's event: `expense.submitted` through the outbox starts the Expense run, once.

The dev app publishes it (`POST /dev/expenses`), its worker drains the
outbox with the registry `duly dev` configures, and the handler starts
`Expense.request_approval`, which asks the manager.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    WorkflowEvent,
    configure_event_registry,
    connect_workflows,
    get_event_registry,
)
from engine.testing import drain
from functions import examples
from functions.examples import Expense
from functions.local.command import configure_events
from functions.local.dev import create_dev_app
from infra.settings import Settings
from tests.apps import outbox
from tests.conftest import Database
from tests.helpers import serving, wait_until

SETTLE = 5.0  # seconds for the worker to route the event and run the step
FAST_WORKER = {"max_idle_interval": timedelta(seconds=0.5)}


@pytest.fixture
def dev_events() -> Iterator[None]:
    """The registry `duly dev` configures for the examples (and back to none afterwards)."""
    configure_events(Settings(database_url=None), [examples.Base.metadata], get_event_registry())
    try:
        yield
    finally:
        configure_event_registry(None)


async def expenses(Session: async_sessionmaker[AsyncSession]) -> list[Expense]:
    async with Session() as session:
        return list((await session.scalars(select(Expense).order_by(Expense.id))).all())


def test_duly_dev_configures_the_examples_registry(dev_events: None) -> None:
    assert get_event_registry() is examples.event_registry


async def test_a_submitted_expense_starts_its_run_once(db: Database, dev_events: None) -> None:
    Session = await db.create(examples.Base.metadata)
    notified_before = examples.managers_notified.count(41)
    async with serving(create_dev_app(Session, worker_options=FAST_WORKER)) as client:
        first = await client.post("/dev/expenses", json={"expense_id": 41, "amount": 120})
        assert first.status_code == 200, first.text
        assert first.json()["expense_id"] == 41

        async def routed(event_id: str) -> dict[str, Any] | None:
            detail = (await client.get(f"/outbox/events/{event_id}")).json()
            return detail if detail["outbox"]["status"] == "processed" else None

        async def waiting() -> bool:
            runs = await expenses(Session)
            return len(runs) == 1 and runs[0].status == "pending"

        await wait_until(waiting, timeout=SETTLE)
        [run] = await expenses(Session)
        assert (run.id, run.amount, run.waiting_for) == (41, 120, "decide")
        await wait_until(lambda: routed(first.json()["event_id"]), timeout=SETTLE)
        detail = await routed(first.json()["event_id"])
        assert detail is not None
        assert detail["event"]["payload"] == {"expense_id": 41, "amount": 120}
        assert detail["event"]["source"] == "duly dev"
        [delivery] = detail["deliveries"]
        assert (delivery["handler"], delivery["status"]) == (
            "functions.examples.start_expense",
            "succeeded",
        )

        # The same expense again: a second event, delivered, and no second run.
        second = await client.post("/dev/expenses", json={"expense_id": 41, "amount": 999})
        assert second.json()["event_id"] != first.json()["event_id"]
        await wait_until(lambda: routed(second.json()["event_id"]), timeout=SETTLE)
        summary = (await client.get("/outbox")).json()
        runs = [r["row"] for r in (await client.get("/workflows/expense/runs")).json()["runs"]]
    assert summary["counts"]["processed"] == 2
    assert [(r["id"], r["amount"]) for r in runs] == [(41, 120)]
    assert examples.managers_notified.count(41) == notified_before + 1


async def test_a_malformed_expense_event_is_dead_lettered_unrouted(
    db: Database, dev_events: None
) -> None:
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session):
        await examples.event_registry.publish_many(
            [
                WorkflowEvent("expense.submitted", "expense_submitted", {"expense_id": "7"}),
                WorkflowEvent("expense.submitted", "expense_submitted", {"amount": 5}),
            ]
        )
    await drain(Session, [examples.Outbox])
    async with Session() as session:
        statuses = (await session.scalars(select(examples.Outbox.status))).all()
        started = await session.scalar(select(func.count()).select_from(Expense))
    assert statuses == ["dead_letter", "dead_letter"]  # the validator refused: no retry
    assert started == 0


async def test_dev_expenses_needs_the_examples_tables(db: Database) -> None:
    Session = await db.create(outbox.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        reply = await client.post("/dev/expenses", json={"expense_id": 1, "amount": 1})
        refused = await client.post("/dev/expenses", json={"expense_id": 0, "amount": 1})
    assert reply.status_code == 404
    assert "DULY_APP=functions.examples" in reply.json()["detail"]
    assert refused.status_code == 422
