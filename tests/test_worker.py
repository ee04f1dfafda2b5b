"""The worker's guarantees, in one process: fencing, retries, shutdown, timers, idleness."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from engine import NotFoundError, connect_workflows, run_workflows
from engine.base.clock import db_now
from engine.testing import drain, move_clock
from engine.worker import loop as worker_module
from tests.apps import behaviour
from tests.apps.behaviour import Alarm, Attempt, Flaky, Held, Pausing, Timer
from tests.conftest import Database
from tests.helpers import connections_checked_out, fetch, wait_until

WAKE_UPS = 4  # idle wake-ups timed

FAST = timedelta(milliseconds=50)


pytestmark = pytest.mark.usefixtures("fresh_behaviour")


async def outcomes(row: object) -> list[tuple[str, str]]:
    return [(a.step, a.outcome) for a in await row.history()]  # type: ignore[attr-defined]


async def test_a_step_whose_lease_was_taken_over_commits_nothing(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    lease = timedelta(seconds=30)
    async with run_workflows(Session, workflows=[Held], lease=lease) as first:
        row = Held()
        assert await row.start(Held.work("first"))
        await wait_until(lambda: behaviour.holding == ["first"])
        # The clock passes the lease: the row is due again while the first step still runs.
        await move_clock(Session, timedelta(minutes=1))
        async with run_workflows(Session, workflows=[Held], lease=lease):
            await wait_until(lambda: len(behaviour.holding) == 2)

            async def second_committed() -> bool:
                return (await fetch(Session, Held, row.id)).value == "run 2"

            await wait_until(second_committed)
            behaviour.release.set()
            await wait_until(lambda: not first._claims)
    stored = await fetch(Session, Held, row.id)
    assert stored.value == "run 2", "the taken-over step's change was discarded"
    assert stored.next_step is None


async def test_a_taken_over_step_that_only_chose_what_comes_next_commits_nothing(
    db: Database,
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    lease = timedelta(seconds=30)
    async with run_workflows(Session, workflows=[Pausing], lease=lease) as first:
        row = Pausing()
        assert await row.start(Pausing.pause("first"))
        await wait_until(lambda: behaviour.holding == ["first"])
        await move_clock(Session, timedelta(minutes=1))
        async with run_workflows(Session, workflows=[Pausing], lease=lease):

            async def second_committed() -> bool:
                stored = await fetch(Session, Pausing, row.id)
                return stored.next_args == {"args": ["after run 2"], "kwargs": {}}

            await wait_until(second_committed)
            behaviour.release.set()
            await wait_until(lambda: not first._claims)
    stored = await fetch(Session, Pausing, row.id)
    assert stored.next_args == {"args": ["after run 2"], "kwargs": {}}
    assert [(h.step, h.outcome) for h in await _history(Session, row)] == [("pause", "ok")]


async def _history(Session, row):  # type: ignore[no-untyped-def]
    async with connect_workflows(Session, workflows=[type(row)]):
        return await row.history()


async def test_shutdown_hands_back_the_lease_of_a_step_it_cancels(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    long_lease = timedelta(minutes=10)
    async with run_workflows(
        Session, workflows=[Held], lease=long_lease, shutdown_timeout=timedelta(milliseconds=100)
    ):
        row = Held()
        assert await row.start(Held.work)
        await wait_until(lambda: len(behaviour.holding) == 1)
    handed_back = await fetch(Session, Held, row.id)
    assert handed_back.claimed_until is None and handed_back.next_step == "work"
    started = time.monotonic()
    async with run_workflows(Session, workflows=[Held], lease=long_lease):

        async def finished() -> bool:
            return (await fetch(Session, Held, row.id)).next_step is None

        await wait_until(finished)
    assert time.monotonic() - started < 2.0, "taken at once, not after the lease"


async def test_timers_survive_a_worker_restart(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        row = Timer()
        assert await row.start(Timer.arm)

        async def armed() -> bool:
            return (await fetch(Session, Timer, row.id)).next_step == "fire"

        await wait_until(armed)
    await move_clock(Session, timedelta(days=1, seconds=1))
    async with run_workflows(Session, workflows=[Timer]):

        async def fired() -> bool:
            return (await fetch(Session, Timer, row.id)).fired == 1

        await wait_until(fired)
    done = await fetch(Session, Timer, row.id)
    assert (done.fired, done.next_step, done.wake_at) == (1, None, None), "fired once, then done"


async def test_a_moved_clock_wakes_a_sleeping_worker(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer], max_idle_interval=timedelta(hours=1)):
        row = Timer()
        assert await row.start(Timer.arm)
        await wait_until(lambda: _armed(Session, row.id))
        await asyncio.sleep(0.1)  # asleep now, for up to an hour
        moved = time.monotonic()
        await move_clock(Session, timedelta(days=2))

        async def fired() -> bool:
            return (await fetch(Session, Timer, row.id)).fired == 1

        await wait_until(fired)
        assert time.monotonic() - moved < 1.0  # an hour without the NOTIFY


async def _armed(Session, key: int) -> bool:  # type: ignore[no-untyped-def]
    return (await fetch(Session, Timer, key)).next_step == "fire"


async def test_failures_retry_with_doubling_backoff_then_stop_with_last_error(
    db: Database,
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.raise_in_step.extend(RuntimeError(f"boom {n}") for n in range(3))
    async with run_workflows(Session, workflows=[Flaky]):
        row = Flaky()
        assert await row.start(Flaky.work)

        async def attempts(n: int) -> bool:
            return (await fetch(Session, Flaky, row.id)).attempts == n

        await wait_until(lambda: attempts(1))
        first = await fetch(Session, Flaky, row.id)
        assert first.last_error == "RuntimeError: boom 0"
        assert first.note == "", "a failed step's changes are discarded"
        await move_clock(Session, timedelta(seconds=10))
        await wait_until(lambda: attempts(2))
        await move_clock(Session, timedelta(seconds=15))  # doubled to 20 s, capped at 15 s
        await wait_until(lambda: attempts(3))
        final = await fetch(Session, Flaky, row.id)
        assert final.next_step is None and final.wake_at is None
        assert final.last_error == "RuntimeError: boom 2"
        assert await outcomes(row) == [("work", "retry"), ("work", "retry"), ("work", "failed")]


async def test_retry_delays_follow_the_policy_on_the_database_clock(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    behaviour.raise_in_step.extend(RuntimeError("x") for _ in range(2))
    async with run_workflows(Session, workflows=[Flaky]):
        row = Flaky()
        assert await row.start(Flaky.work)
        for expected, move in ((10, 10), (15, 15)):

            async def failed_once_more(n: int = expected) -> bool:
                stored = await fetch(Session, Flaky, row.id)
                return (
                    stored.last_error is not None
                    and stored.claimed_until is None
                    and (stored.attempts == (1 if n == 10 else 2))
                )

            await wait_until(failed_once_more)
            async with Session() as session:
                left = await session.scalar(
                    select(Flaky.wake_at - db_now()).where(Flaky.id == row.id)
                )
            assert left is not None
            assert timedelta(seconds=expected - 1) < left <= timedelta(seconds=expected)
            await move_clock(Session, timedelta(seconds=move))


async def test_a_commit_the_database_refuses_is_a_failed_attempt(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Flaky]):
        row = Flaky()
        assert await row.start(Flaky.too_long)

        async def failed() -> bool:
            return (await fetch(Session, Flaky, row.id)).attempts == 1

        await wait_until(failed)
        stored = await fetch(Session, Flaky, row.id)
        assert stored.note == "" and stored.next_step == "too_long"
        assert stored.last_error is not None and "too long" in stored.last_error
        await move_clock(Session, timedelta(seconds=1))

        async def gave_up() -> bool:
            return (await fetch(Session, Flaky, row.id)).next_step is None

        await wait_until(gave_up)
        assert await outcomes(row) == [("too_long", "retry"), ("too_long", "failed")]


@pytest.mark.parametrize(
    ("what", "shown"),
    [("number", "returned 42 (int)"), ("text", "returned 'hello' (str)"), ("list", "[1] (list)")],
)
async def test_a_step_that_returns_no_directive_fails_and_says_what_it_returned(
    db: Database, what: str, shown: str
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Flaky]):
        row = Flaky()
        assert await row.start(Flaky.returns(what))

        async def stopped() -> bool:
            return (await fetch(Session, Flaky, row.id)).last_error is not None

        await wait_until(stopped)
    stored = await fetch(Session, Flaky, row.id)
    assert stored.last_error is not None and shown in stored.last_error
    assert "not a directive" in stored.last_error
    assert stored.next_step is None


async def test_returning_another_workflows_step_or_a_bare_step_needing_arguments_fails(
    db: Database,
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Flaky, behaviour.Other]):
        jumper = behaviour.Other()
        assert await jumper.start(behaviour.Other.jump)
        bare = Flaky()
        assert await bare.start(Flaky.returns_bare_needing_args)

        async def both_failed() -> bool:
            a = await fetch(Session, behaviour.Other, jumper.id)
            b = await fetch(Session, Flaky, bare.id)
            return a.last_error is not None and b.last_error is not None

        await wait_until(both_failed)
        assert (
            "Timer.fire belongs to another workflow"
            in (await fetch(Session, behaviour.Other, jumper.id)).last_error
        )  # type: ignore[operator]
        assert "Flaky.needs needs arguments" in (await fetch(Session, Flaky, bare.id)).last_error  # type: ignore[operator]


async def test_a_run_started_in_the_workers_process_starts_at_once(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer], max_idle_interval=timedelta(hours=1)):
        await asyncio.sleep(0.1)
        row = Timer()
        started = time.monotonic()
        assert await row.start(Timer.arm)
        await wait_until(lambda: _armed(Session, row.id))
        assert time.monotonic() - started < 0.5  # an hour without the kick


def backend_activity(db: Database) -> list[tuple[object, ...]]:
    return db.sql(
        "SELECT pid, query_start, xact_start FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid"
    )


async def test_an_idle_worker_makes_no_query_between_wake_ups(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(
        Session, workflows=[Timer], max_idle_interval=timedelta(seconds=30)
    ) as worker:
        assert worker.listener is not None
        await asyncio.wait_for(worker.listener.connected.wait(), 5)
        # Asleep: its pass over, the pass connection given back (the LISTEN one stays out).
        await wait_until(lambda: connections_checked_out(Session.kw["bind"]) == 1)
        before, passes = backend_activity(db), worker.passes
        await asyncio.sleep(2.0)  # the claim is what a sleeping worker does in this time
        after = backend_activity(db)
        assert worker.passes == passes
        assert after == before, "no statement reached the server while the worker slept"


async def test_a_worker_wakes_no_more_often_than_its_max_idle_interval(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(
        Session, workflows=[Timer], max_idle_interval=timedelta(milliseconds=400)
    ) as worker:
        # Past its first looks (the listener's connecting kicks one): from here on, idle.
        await wait_until(lambda: worker.passes >= 3)
        started = worker.passes
        await wait_until(lambda: worker.passes > started)  # a wake-up begins: time from here
        passes, began = worker.passes, time.monotonic()
        await wait_until(lambda: worker.passes >= passes + WAKE_UPS, timeout=5)
        took = time.monotonic() - began
    # WAKE_UPS wake-ups max_idle_interval (0.4 s) apart, never sooner, and about that often
    # (at most 0.67 s each, as three in two seconds was).
    assert WAKE_UPS * 0.4 * 0.95 <= took <= WAKE_UPS * 0.67, f"{WAKE_UPS} took {took:.2f} s"


async def test_history_records_one_row_per_attempt_in_the_steps_commit(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        row = Timer()
        assert await row.start(Timer.arm)
        await wait_until(lambda: _armed(Session, row.id))
        history = await row.history()
    assert [(h.step, h.attempt, h.outcome, h.error) for h in history] == [("arm", 1, "ok", None)]
    assert history[0].took_ms >= 0 and history[0].finished_at is not None
    assert isinstance(history[0], Attempt)


async def test_a_deployment_without_an_attempt_log_pays_nothing(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    db.sql("DROP TABLE workflow_attempt")
    async with run_workflows(Session, workflows=[Timer]) as worker:
        assert worker.connection.attempt_log is None
        row = Timer()
        assert await row.start(Timer.arm)
        await wait_until(lambda: _armed(Session, row.id))
        with pytest.raises(NotFoundError, match="No AttemptLog"):
            await row.history()


async def test_connect_workflows_runs_nothing(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):
        row = Timer()
        assert await row.start(Timer.arm)
        # The claim is an absence: in this time, with no worker, nothing ran it.
        await asyncio.sleep(0.3)
        assert (await fetch(Session, Timer, row.id)).next_step == "arm"


async def test_drain_runs_what_a_step_made_due_while_its_pass_was_still_going(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step may finish and commit before the pass that claimed it is over; drain looks again."""
    Session = await db.create(behaviour.Base.metadata)
    real_next_due = worker_module.next_due

    async def slow_next_due(*args: Any, **kwargs: Any) -> Any:
        # The pass waits here until `arm` has run and committed meanwhile.
        await wait_until(lambda: not db.sql("SELECT 1 FROM alarm WHERE next_step = 'arm'"))
        return await real_next_due(*args, **kwargs)

    monkeypatch.setattr(worker_module, "next_due", slow_next_due)
    async with connect_workflows(Session, workflows=[Alarm]):
        row = Alarm()
        assert await row.start(Alarm.arm(0))
    assert await drain(Session, [Alarm]) == 2
    assert (await fetch(Session, Alarm, row.id)).rang_at is not None


async def test_a_steps_log_line_names_what_comes_next_but_never_its_arguments(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Arguments carry payloads and personal data: the INFO line says `Pausing.pause(…)`."""
    Session = await db.create(behaviour.Base.metadata)
    behaviour.release.set()  # the first pause holds until released
    with caplog.at_level("INFO", logger="duly.worker"):
        async with run_workflows(Session, workflows=[Pausing]):
            row = Pausing()
            assert await row.start(Pausing.pause("jane@example.com"))
            await wait_until(lambda: len(behaviour.holding) == 1)

            def logged() -> bool:
                return any(" pause ok in " in r.getMessage() for r in caplog.records)

            await wait_until(logged)
    [line] = [r.getMessage() for r in caplog.records if " pause ok in " in r.getMessage()]
    assert line.endswith(", next Pausing.pause(…) in 1 day, 0:00:00"), line
    assert "after run" not in line
    assert "jane@example.com" not in caplog.text
