"""deliver says what became of an event: taken now, held until the run waits, or refused and
why; one verdict a run, counted apart for many, at every door.

- a waiting run takes the event now; a run on its way to a wait holds it (the int the count
  always was says 1 either way) and takes it once it waits: test_a_waiting_run_takes_the_event_now,
  test_a_run_on_its_way_holds_the_event_until_it_waits
- each refusal names its reason: test_each_refusal_of_one_run_names_its_reason
- a delivery to many counts taken, held and each refusal apart, in one statement:
  test_a_delivery_to_many_runs_counts_each_kind_apart
- the API answers the three counts and the sentence:
  test_the_deliver_route_answers_each_reason_and_counts_many,
  test_the_deliver_route_tells_taken_from_held
- the console's run page says taken, held or refused: test_the_console_says_taken_held_or_refused
"""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import Delivery, connect_workflows
from engine.testing import drain, move_clock
from functions.app import create_app
from tests.apps import api
from tests.apps.api import Invoice
from tests.conftest import Database
from tests.helpers import csrf_of, serving

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


async def test_a_waiting_run_takes_the_event_now(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    delivered = await deliver_pay(Session, await issued(Session, "A-1"))
    assert (delivered.taken, delivered.held, delivered.refused) == (1, 0, {})
    assert delivered == 1 and delivered.accepted == 1, "the count it always was"
    assert delivered.explanation() == "1 run took the event now."
    assert repr(delivered) == "Delivery(taken=1, held=0, refused={})"
    with pytest.raises(AttributeError, match="immutable"):
        delivered.taken = 2  # type: ignore[misc]


async def test_a_run_on_its_way_holds_the_event_until_it_waits(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    on_its_way = await issued(Session, "H-0", run=False)  # `issue` not run yet: no wait armed
    delivered = await deliver_pay(Session, on_its_way)
    assert (delivered.taken, delivered.held, delivered.refused) == (0, 1, {})
    assert delivered == 1, "accepted: held counts as accepted, as it always did"
    assert delivered.explanation() == "1 run holds the event until it waits for it."
    await drain(Session, [Invoice])  # `issue` waits for `pay`, and takes the held event
    async with Session() as session:
        invoice = await session.get(Invoice, on_its_way)
        assert invoice is not None and invoice.status == "paid 10 by card"


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
    assert (await deliver_pay(Session, on_its_way)).held == 1, "held until it waits"
    reasons["holding_another_event"] = await deliver_pay(Session, on_its_way)
    cancelled = await issued(Session, "C-1")
    async with connect_workflows(Session, workflows=[Invoice]):
        assert await Invoice.by(Invoice.id == cancelled).cancel() == 1
    reasons["cancelled"] = await deliver_pay(Session, cancelled)
    late = await issued(Session, "L-1")
    await move_clock(Session, timedelta(days=2))
    reasons["deadline_passed"] = await deliver_pay(Session, late)
    for reason, delivered in reasons.items():
        counts = (delivered, delivered.taken, delivered.held, delivered.refused)
        assert counts == (0, 0, 0, {reason: 1}), reason
    assert reasons["unknown_key"].explanation() == (
        "No run took the event; 1 refused it: no run has this key."
    )


async def test_a_delivery_to_many_runs_counts_each_kind_apart(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    for number in ("M-1", "M-2", "M-3"):
        await issued(Session, number)  # waiting for `pay`
    for number in ("M-4", "M-5", "M-6"):
        await issued(Session, number, run=False)  # on their way to the wait
    async with connect_workflows(Session, workflows=[Invoice]):
        assert await Invoice.by(Invoice.number == "M-3").cancel() == 1
        first = await Invoice.by(Invoice.number == "M-4").deliver(Invoice.pay(amount=1))
        assert (first.taken, first.held) == (0, 1)
        delivered = await Invoice.by(Invoice.total == 10).deliver(Invoice.pay(amount=10))
        nothing = await Invoice.by(Invoice.total == 99).deliver(Invoice.pay(amount=10))
    assert (delivered.taken, delivered.held, delivered.accepted) == (2, 2, 4)
    assert delivered.refused == {"cancelled": 1, "holding_another_event": 1}
    assert delivered.explanation() == (
        "2 runs took the event now; 2 runs hold the event until they wait for it; 2 refused "
        "it: the run was cancelled (deliver with restart to start it again) (1); the run, on "
        "its way to a wait, holds another event already (1)."
    )
    assert (nothing, nothing.taken, nothing.held, nothing.refused) == (0, 0, 0, {})
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
            "taken": 1,
            "held": 0,
            "refused": {},
            "message": "1 run took the event now.",
        }
        reasons["deduplicated"] = await deliver({**pay, "key": waiting, "idempotency_key": "k"})
        await drain(Session, [Invoice])
        reasons["finished"] = await deliver({**pay, "key": waiting})
        await client.post("/workflows/invoice/cancel", json={"key": cancelled})
        reasons["cancelled"] = await deliver({**pay, "key": cancelled})
        took = await deliver({**pay, "key": on_its_way})  # waiting since the drain
        assert (took["accepted"], took["taken"], took["held"]) == (1, 1, 0)
        reasons["holding_another_event"] = await deliver({**pay, "key": on_its_way})
        await move_clock(Session, timedelta(days=2))
        reasons["deadline_passed"] = await deliver({**pay, "key": late})
        many = await deliver({**pay, "where": {"total": 10}})
    for reason, answer in reasons.items():
        counts = (answer["accepted"], answer["taken"], answer["held"], answer["refused"])
        assert counts == (0, 0, 0, {reason: 1}), reason
        assert isinstance(answer["message"], str) and "1 refused it" in answer["message"]
    assert (many["accepted"], many["taken"], many["held"]) == (0, 0, 0)
    assert many["refused"] == {
        "cancelled": 1,
        "deadline_passed": 1,
        "finished": 1,
        "holding_another_event": 1,
    }


async def test_the_deliver_route_tells_taken_from_held(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    finished = await issued(Session, "T-4")
    await deliver_pay(Session, finished)
    await issued(Session, "T-1")  # its drain runs T-4's `pay` too
    await issued(Session, "T-2")
    await issued(Session, "T-3", run=False)  # a drain would make it wait
    async with serving(create_app(Session, run_worker=False)) as client:
        body = {"step": "pay", "args": {"amount": 10}, "where": {"total": 10}}
        reply = await client.post("/workflows/invoice/deliver", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "workflow": "invoice",
        "accepted": 3,
        "taken": 2,
        "held": 1,
        "refused": {"finished": 1},
        "message": "2 runs took the event now; 1 run holds the event until it waits for it; "
        "1 refused it: the run has finished (deliver with restart to start it again).",
    }


# -- in the console -------------------------------------------------------------------------


async def test_the_console_says_taken_held_or_refused(
    Session: async_sessionmaker[AsyncSession],
) -> None:
    waiting, on_its_way = await issued(Session, "C-1"), await issued(Session, "C-2", run=False)
    async with serving(create_app(Session, run_worker=False)) as client:

        async def deliver(key: int) -> str:
            page = f"/console/runs/invoice/{key}"
            form = {"csrf_token": csrf_of(await client.get(page)), "step": "pay"}
            done = await client.post(
                f"{page}/deliver", data={**form, "args.amount": "10", "confirmed": "yes"}
            )
            assert done.status_code == 303, done.text
            landed = await client.get(done.headers["location"])
            found = re.search(r'role="status"[^>]*>\s*([^<]*)<', landed.text)
            assert found is not None, landed.text
            return html.unescape(found.group(1)).strip()

        assert await deliver(waiting) == "Delivered: the run took the event now."
        assert await deliver(on_its_way) == (
            "Held: the run is not waiting for this event yet; it holds it until it waits for "
            "it, and drops it if it ends, fails or waits for another step first."
        )
        assert await deliver(on_its_way) == (
            "Not delivered: the run, on its way to a wait, holds another event already."
        )
