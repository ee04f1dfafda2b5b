"""deliver says why a run refused an event: one reason a run, counted for many."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import Delivery, connect_workflows
from engine.testing import drain, move_clock
from functions.app import create_app
from tests.apps import api
from tests.apps.api import Invoice
from tests.conftest import Database
from tests.helpers import serving

pytestmark = pytest.mark.usefixtures("open_writes")  # the routes' answers are under test


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(api.Base.metadata)


async def issued(Session: async_sessionmaker[AsyncSession], number: str, run: bool = True) -> int:
    """An invoice run; after its first step (waiting for `pay`) unless not `run`."""
    async with connect_workflows(Session, workflows=[Invoice]):
        row = Invoice(number=number, total=10)
        assert await row.start(Invoice.issue)
    if run:
        await drain(Session, [Invoice])
    return row.id


async def deliver_pay(
    Session: async_sessionmaker[AsyncSession], number: int, key: str | None = None
) -> Delivery:
    async with connect_workflows(Session, workflows=[Invoice]):
        return await Invoice.by_key(number).deliver(Invoice.pay(amount=10), key=key)


async def test_an_accepted_delivery_refuses_nothing(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    delivered = await deliver_pay(Session, await issued(Session, "A-1"))
    assert delivered == 1 and delivered.refused == {}
    assert delivered.explanation() == "1 run accepted the event."


async def test_each_refusal_of_one_run_names_its_reason(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    reasons: dict[str, Delivery] = {"unknown_key": await deliver_pay(Session, 404)}
    waiting = await issued(Session, "W-1")
    async with connect_workflows(Session, workflows=[Invoice]):
        other = Invoice.by(Invoice.id == waiting)
        reasons["waiting_for_other_step"] = await other.deliver(Invoice.chase)
    assert await deliver_pay(Session, waiting, key="once") == 1
    reasons["deduplicated"] = await deliver_pay(Session, waiting, key="once")
    await drain(Session, [Invoice])
    reasons["finished"] = await deliver_pay(Session, waiting)
    on_its_way = await issued(Session, "H-1", run=False)
    assert await deliver_pay(Session, on_its_way) == 1, "held until it waits"
    reasons["holding_another_event"] = await deliver_pay(Session, on_its_way)
    cancelled = await issued(Session, "C-1")
    async with connect_workflows(Session, workflows=[Invoice]):
        assert await Invoice.by(Invoice.id == cancelled).cancel() == 1
    reasons["cancelled"] = await deliver_pay(Session, cancelled)
    late = await issued(Session, "L-1")
    await move_clock(Session, timedelta(days=2))
    reasons["deadline_passed"] = await deliver_pay(Session, late)
    for reason, delivered in reasons.items():
        assert (delivered, delivered.refused) == (0, {reason: 1}), reason
    assert reasons["unknown_key"].explanation() == (
        "0 runs accepted the event; 1 refused it: no run has this key (1)."
    )


async def test_a_delivery_to_many_runs_counts_the_refusals_in_its_statement(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    for number in ("M-1", "M-2", "M-3"):
        await issued(Session, number)
    await issued(Session, "M-4", run=False)
    async with connect_workflows(Session, workflows=[Invoice]):
        assert await Invoice.by(Invoice.number == "M-3").cancel() == 1
        assert await Invoice.by(Invoice.number == "M-4").deliver(Invoice.pay(amount=1)) == 1
        delivered = await Invoice.by(Invoice.total == 10).deliver(Invoice.pay(amount=10))
        nothing = await Invoice.by(Invoice.total == 99).deliver(Invoice.pay(amount=10))
    assert delivered == 2
    assert delivered.refused == {"cancelled": 1, "holding_another_event": 1}
    assert delivered.explanation() == (
        "2 runs accepted the event; 2 refused it: the run was cancelled (deliver with restart "
        "to start it again) (1); the run, on its way to a wait, holds another event already (1)."
    )
    assert (nothing, nothing.refused) == (0, {})
    assert nothing.explanation() == "No run matched: nothing was delivered."


# -- over HTTP ------------------------------------------------------------------------------


async def test_the_deliver_route_answers_each_reason_and_counts_many(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    waiting, late = await issued(Session, "HW-1"), await issued(Session, "HL-1")
    cancelled, on_its_way = await issued(Session, "HC-1"), await issued(Session, "HH-1", run=False)
    pay = {"step": "pay", "args": {"amount": 10}}
    async with serving(create_app(Session, run_worker=False)) as client:

        async def deliver(body: dict[str, object]) -> dict[str, object]:
            reply = await client.post("/workflows/invoice/deliver", json=body)
            assert reply.status_code == 200, reply.text
            answer: dict[str, object] = reply.json()
            return answer

        reasons = {
            "unknown_key": await deliver({**pay, "key": 404}),
            "waiting_for_other_step": await deliver({"key": waiting, "step": "chase"}),
        }
        assert await deliver({**pay, "key": waiting, "idempotency_key": "k"}) == {
            "workflow": "invoice",
            "accepted": 1,
        }, "an accepted delivery answers as it always did"
        reasons["deduplicated"] = await deliver({**pay, "key": waiting, "idempotency_key": "k"})
        await drain(Session, [Invoice])
        reasons["finished"] = await deliver({**pay, "key": waiting})
        await client.post("/workflows/invoice/cancel", json={"key": cancelled})
        reasons["cancelled"] = await deliver({**pay, "key": cancelled})
        assert (await deliver({**pay, "key": on_its_way}))["accepted"] == 1
        reasons["holding_another_event"] = await deliver({**pay, "key": on_its_way})
        await move_clock(Session, timedelta(days=2))
        reasons["deadline_passed"] = await deliver({**pay, "key": late})
        many = await deliver({**pay, "where": {"total": 10}})
    for reason, answer in reasons.items():
        assert answer["accepted"] == 0 and answer["refused"] == {reason: 1}, reason
        assert isinstance(answer["message"], str) and "1 refused it" in answer["message"]
    assert many["accepted"] == 0
    assert many["refused"] == {
        "cancelled": 1,
        "deadline_passed": 1,
        "finished": 1,
        "holding_another_event": 1,
    }
