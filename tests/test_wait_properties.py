"""Waiting for an event, under random interleavings checked against a model of the rules.

Hypothesis draws a list of actions — deliveries with and without keys, worker
passes (`drain`), clock moves, `run(Waiter.begin)`, `cancel()`, and changes to
what `Waiter.answer` does next — and plays them on a fresh database. `Rules`,
a few lines of Python per rule, predicts what each call returns and what the
run does; the test asserts the database agrees after every action, then that
no wait ended twice and no accepted event was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, event, example, given, settings, strategies as st
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.base.clock import db_now
from engine.testing import drain, move_clock
from engine.worker.execution import RECENT_EVENT_KEYS
from tests.apps import waits
from tests.apps.waits import AFTER_ANSWER, Waiter
from tests.conftest import Database, Server, fresh_database
from tests.helpers import fetch

TIMEOUT = waits.TIMEOUT // timedelta(minutes=1)  # minutes
SCHEDULE = waits.SCHEDULE // timedelta(minutes=1)  # minutes
# The clock moves in whole minutes and an example takes far less than one of real time, so
# the model counts in minutes: a move landing exactly on a deadline (or on a schedule's next
# occurrence) is past it, since real time has moved on as well.
MOVES = (10, 30, 59, 60, 61, 120)  # minutes
KEYS = ("a", "b", "c")  # few, so keys repeat

Event = tuple[int, str | None]  # an answer's value and key


@dataclass
class Rules:
    """The run as the seed's rules (and the engine) say it should be, in Python."""

    now: int = 0  # minutes the database clock has been moved
    after_answer: str = "wait"
    next_step: str | None = "begin"
    due: int = 0  # when next_step comes due, in minutes of moved clock
    event: Event | None = None  # next_step == "answer": the event it runs
    waiting_for: str | None = None
    deadline: int | None = None
    held: Event | None = None
    taken: list[str] = field(default_factory=list)  # keys taken, the last sixteen
    received: list[int] = field(default_factory=list)
    begins: int = 0
    waits: int = 0
    timeouts: int = 0
    endings: list[list[object]] = field(default_factory=list)  # [wait, "answer" | "timeout"]
    interrupted: set[int] = field(default_factory=set)  # waits run() or cancel() ended
    accepted: list[int] = field(default_factory=list)  # values deliver returned 1 for
    discarded: dict[int, str] = field(default_factory=dict)  # value -> the rule that dropped it

    def deliver(self, value: int, key: str | None) -> tuple[int, str]:
        """What deliver returns, and which rule decided."""
        if key is not None and key in self.taken:
            return 0, "refused: key taken"
        if key is not None and key in {e[1] for e in (self.event, self.held) if e is not None}:
            return 0, "refused: key of an event not yet run"
        if self.waiting_for == "answer" and self.deadline is not None:
            if self.now >= self.deadline:
                return 0, "refused: past the deadline"
            self._schedule_answer((value, key))
            why = "accepted by the wait"
        # Held while a step is scheduled or running; an accepted event that no worker
        # has taken yet still counts as the one held.
        elif self.waiting_for is None and self.next_step is not None:
            if self.held is not None or self.event is not None:
                return 0, "refused: one already held"
            self.held = (value, key)
            why = f"held while {self.next_step} is scheduled"
        else:
            return 0, "refused: stopped" if self.next_step is None else "refused: waits for other"
        self.accepted.append(value)
        return 1, why

    def run(self) -> int:
        """`run(Waiter.begin)`: replaces whatever was scheduled or held, ends the wait."""
        self._end_wait()
        self._drop("run() replaced it")
        self.next_step, self.due = "begin", self.now
        return 1

    def cancel(self) -> int:
        """`cancel()`: nothing scheduled, no wait, no held event; 1 if the run was live."""
        live = self.next_step is not None or self.waiting_for is not None
        self._end_wait()
        self._drop("cancel() ended the run")
        self.next_step = None
        return int(live)

    def drain(self) -> None:
        """A worker pass: run every step due now, and what they make due now."""
        while self.next_step is not None and self.due <= self.now:
            if self.next_step == "begin":
                self.begins += 1
                self._arm("answer")
            elif self.next_step == "answer":
                assert self.event is not None
                self._answer(*self.event)
            else:
                self.timeouts += 1
                self.endings.append([self.waits, "timeout"])
                self.waiting_for = self.deadline = None
                self._stop("the run stopped")

    def _answer(self, value: int, key: str | None) -> None:
        self.received.append(value)
        self.endings.append([self.waits, "answer"])
        if key is not None:
            self.taken = [*self.taken, key][-RECENT_EVENT_KEYS:]
        if self.after_answer == "stop":
            self._stop("the run stopped")
        elif self.after_answer == "schedule":
            # The next occurrence counts from the one served; missed ones collapse.
            served = self.due
            self.next_step, self.event = "begin", None
            self.due = served + SCHEDULE * (max(self.now - served, 0) // SCHEDULE + 1)
            self._drop_held("the run went round its schedule")
        else:
            self._arm("other" if self.after_answer == "other" else "answer")

    def _arm(self, target: str) -> None:
        self.waits += 1
        if self.held is not None and target == "answer":
            held, self.held = self.held, None
            self._schedule_answer(held)
            return
        self._drop_held("the run waits for another step")
        self.waiting_for, self.deadline = target, self.now + TIMEOUT
        self.next_step, self.due, self.event = "expire", self.deadline, None

    def _schedule_answer(self, event: Event) -> None:
        self.next_step, self.due, self.event = "answer", self.now, event
        self.waiting_for = self.deadline = None

    def _stop(self, reason: str) -> None:
        self._drop_held(reason)
        self.next_step = self.event = None

    def _end_wait(self) -> None:
        # The wait open, or answered by an event its step has not run yet, never records
        # an ending: run() or cancel() ended it.
        if self.waiting_for is not None or self.next_step == "answer":
            self.interrupted.add(self.waits)
        self.waiting_for = self.deadline = None

    def _drop(self, reason: str) -> None:
        if self.event is not None:
            self.discarded[self.event[0]] = reason
        self.event = None
        self._drop_held(reason)

    def _drop_held(self, reason: str) -> None:
        if self.held is not None:
            self.discarded[self.held[0]] = reason
        self.held = None


Action = tuple[Any, ...]  # the kind of action, then its argument if it takes one

# Repeated entries weigh the draw: mostly deliveries and worker passes.
KINDS = ("deliver",) * 5 + ("drain",) * 4 + ("move",) * 3 + ("run", "cancel", "mode")
CHOICES = {
    "deliver": st.sampled_from((None, None, *KEYS)),
    "move": st.sampled_from([str(m) for m in MOVES]),
    "mode": st.sampled_from(AFTER_ANSWER),
}


def _action(kind: str) -> st.SearchStrategy[Action]:
    choice = CHOICES.get(kind)
    return st.just((kind,)) if choice is None else choice.map(lambda c: (kind, c))


actions = st.lists(st.sampled_from(KINDS).flatmap(_action), min_size=8, max_size=40)

EVICTION = [
    ("drain",),
    *[a for n in range(RECENT_EVENT_KEYS + 1) for a in (("deliver", f"k{n}"), ("drain",))],
    ("deliver", f"k{RECENT_EVENT_KEYS}"),  # still remembered: refused
    ("deliver", "k0"),  # forgotten: accepted
    ("drain",),
]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(initial=st.sampled_from(AFTER_ANSWER), actions=actions)
@example(initial="wait", actions=[("drain",), ("move", "60"), ("deliver", None), ("drain",)])
@example(initial="wait", actions=[("drain",), ("move", "59"), ("deliver", "a"), ("move", "1")])
@example(initial="other", actions=[("deliver", "a"), ("drain",), ("deliver", "a")])
@example(initial="wait", actions=EVICTION)
def test_a_wait_ends_once_and_no_accepted_event_is_lost(
    server: Server, initial: str, actions: list[Action]
) -> None:
    asyncio.run(play(server, initial, actions))


async def play(server: Server, initial: str, actions: list[Action]) -> None:
    """Play `actions` on a fresh database and on `Rules`; assert they agree throughout."""
    rules = Rules(after_answer=initial)
    async with (
        fresh_database_with_waits(server) as Session,
        connect_workflows(Session, workflows=[Waiter]),
    ):
        row = Waiter(after_answer=initial)
        assert await row.start(Waiter.begin)
        handle = Waiter.by(Waiter.id == row.id)
        for value, action in enumerate(actions):
            what = action[0]
            if what == "deliver":
                key = action[1]
                got = await handle.deliver(Waiter.answer(value), key=key)
                expected, why = rules.deliver(value, key)
                event(why)
                assert got == expected, f"deliver #{value} key={key!r}: {why}"
            elif what == "drain":
                await drain(Session, [Waiter])
                rules.drain()
            elif what == "move":
                await move_clock(Session, timedelta(minutes=int(action[1])))
                rules.now += int(action[1])
            elif what == "run":
                assert await handle.run(Waiter.begin) == rules.run()
            elif what == "cancel":
                assert await handle.cancel() == rules.cancel()
            else:
                async with Session.begin() as session:
                    await session.execute(
                        update(Waiter).where(Waiter.id == row.id).values(after_answer=action[1])
                    )
                rules.after_answer = action[1]
            await agree(Session, row.id, rules, f"after #{value} {action}")
        # Worker passes until nothing is left to apply (a scheduled begin comes due within
        # SCHEDULE, and applies what it holds), then until every open wait has timed out.
        for minutes in (0, SCHEDULE, TIMEOUT + 1):
            await move_clock(Session, timedelta(minutes=minutes))
            rules.now += minutes
            await drain(Session, [Waiter])
            rules.drain()
            if minutes == SCHEDULE:
                assert rules.held is None and rules.event is None
        stored = await agree(Session, row.id, rules, "at the end")

    ended = [wait for wait, _ in stored.endings]
    assert len(ended) == len(set(ended)), f"a wait ended twice: {stored.endings}"
    assert stored.answers + stored.timeouts == len(stored.endings)
    still_open = {stored.waits} if stored.waiting_for is not None else set()
    assert sorted([*ended, *rules.interrupted, *still_open]) == list(range(1, stored.waits + 1)), (
        "every wait ends exactly once: by an event, its timeout, run() or cancel()"
    )
    kept = [value for value in rules.accepted if value not in rules.discarded]
    assert sorted(stored.received) == sorted(kept), "an accepted event was lost"


async def agree(
    Session: async_sessionmaker[AsyncSession], run_id: int, rules: Rules, when: str
) -> Waiter:
    """Assert the row is as `rules` has it; return the row."""
    stored = await fetch(Session, Waiter, run_id)
    held = stored.pending_event
    seen = {
        "next_step": stored.next_step,
        "event": (stored.next_args["args"][0], stored.next_args.get("event_key"))
        if stored.next_step == "answer" and stored.next_args is not None
        else None,
        "waiting_for": stored.waiting_for,
        "held": (held["args"][0], held.get("event_key")) if held is not None else None,
        "taken": stored.recent_event_keys or [],
        "received": stored.received,
        "counts": (stored.answers, stored.timeouts, stored.begins, stored.waits),
        "endings": stored.endings,
    }
    expected = {
        "next_step": rules.next_step,
        "event": rules.event,
        "waiting_for": rules.waiting_for,
        "held": rules.held,
        "taken": rules.taken,
        "received": rules.received,
        "counts": (len(rules.received), rules.timeouts, rules.begins, rules.waits),
        "endings": rules.endings,
    }
    assert seen == expected, when
    return stored


@contextlib.asynccontextmanager
async def fresh_database_with_waits(
    server: Server,
) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """A database of the example's own with the wait tables, dropped afterwards."""
    async with fresh_database(server) as database:
        yield await database.create(waits.Base.metadata)


async def test_an_accepted_event_counts_as_held_until_a_worker_takes_it(db: Database) -> None:
    Session = await db.create(waits.Base.metadata)
    async with connect_workflows(Session, workflows=[Waiter]):
        row = Waiter(after_answer="stop")
        assert await row.start(Waiter.begin)
        await drain(Session, [Waiter])
        handle = Waiter.by(Waiter.id == row.id)
        assert await handle.deliver(Waiter.answer(1)) == 1
        # No worker has taken the first: the seed refuses a second while one is held.
        assert await handle.deliver(Waiter.answer(2)) == 0


DEADLINE_LEAD = 0.5  # seconds before the deadline the delivery below starts


async def test_a_delivery_held_up_on_a_lock_across_the_deadline_is_taken(
    db: Database,
) -> None:
    Session = await db.create(waits.Base.metadata)
    async with connect_workflows(Session, workflows=[Waiter]):
        row = Waiter(after_answer="stop")
        assert await row.start(Waiter.begin)
        await drain(Session, [Waiter])
        waiting = await fetch(Session, Waiter, row.id)
        assert waiting.next_args is not None
        deadline = datetime.fromisoformat(waiting.next_args["deadline"])
        async with Session() as session:
            now = (await session.execute(select(db_now()))).scalar_one()
        assert isinstance(now, datetime)
        await move_clock(Session, deadline - now - timedelta(seconds=DEADLINE_LEAD))
        async with await psycopg.AsyncConnection.connect(db.conninfo) as locker:
            # Another transaction holds the row (as a worker's claim or commit would).
            await locker.execute("SELECT 1 FROM wait_run WHERE id = %s FOR UPDATE", [row.id])
            handle = Waiter.by(Waiter.id == row.id)
            delivery = asyncio.create_task(handle.deliver(Waiter.answer(1)))
            await asyncio.sleep(DEADLINE_LEAD * 3)  # the deadline passes while it waits
            assert not delivery.done()
            await locker.commit()
        # The seed: "The deadline is judged as the delivery reaches the row, so one held
        # up on a lock across the deadline is taken."
        assert await delivery == 1
