"""The kick after a commit (`infra/aws/kicks.py`): debounced per process, none lost, never raised.

The debounce tests drive `AsyncKicker` with a recording `invoke` and read
the loop's clock; the last ones start, run and deliver through
`connect_workflows` on a real database and check the invoke came after the
commit (another connection already sees the row).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import pytest

from engine import connect_workflows
from engine.base.errors import ConfigurationError
from infra.aws import kicks
from infra.aws.kicks import AsyncKicker, aws_wake_invoke, kick_wake_after_commits
from tests.apps import serverless
from tests.apps.serverless import Reminder
from tests.conftest import Database
from tests.helpers import wait_until

INTERVAL = 0.05  # seconds: short, so the debounce tests are quick
EARLY = 0.002  # seconds a loop timer may fire before its time (the clock's resolution)


class Invokes:
    """A recording `invoke`: the loop time at which each send started."""

    def __init__(self, fail: int = 0, seconds: float = 0.0) -> None:
        self.at: list[float] = []
        self.fail = fail  # the first `fail` sends raise
        self.seconds = seconds  # how long each send takes
        self.finished = 0

    async def __call__(self) -> None:
        self.at.append(asyncio.get_running_loop().time())
        if self.seconds:
            await asyncio.sleep(self.seconds)
        if len(self.at) <= self.fail:
            raise ConnectionError("the Lambda API is unreachable")
        self.finished += 1


async def settle(kicker: AsyncKicker) -> None:
    """Wait until no trailing send is scheduled, then for the sends."""
    while kicker.waiting:
        await asyncio.sleep(INTERVAL / 4)
    await kicker.flush()


async def test_the_first_kick_is_sent_at_once_and_a_burst_becomes_one_trailing_send() -> None:
    invokes = Invokes()
    kicker = AsyncKicker(invokes, INTERVAL)
    loop = asyncio.get_running_loop()
    first = loop.time()
    kicker("orders")
    await asyncio.sleep(0)  # the send is a task: it starts on the next turn of the loop
    assert len(invokes.at) == 1 and invokes.at[0] - first < INTERVAL, "no delay after quiet"
    burst = loop.time()
    for _ in range(50):
        kicker("orders")
    assert kicker.waiting, "kicks inside the interval wait for its end"
    await settle(kicker)
    assert len(invokes.at) == 2, "fifty kicks in one interval: one trailing send"
    assert invokes.at[1] >= burst, "the trailing send starts after the kicks it stands for"
    assert invokes.at[1] - invokes.at[0] >= INTERVAL - EARLY
    assert (kicker.requested, kicker.sent) == (51, 2)

    await asyncio.sleep(INTERVAL * 1.5)  # quiet again: the next kick goes at once
    quiet = loop.time()
    kicker("orders")
    await asyncio.sleep(0)
    assert len(invokes.at) == 3 and invokes.at[2] - quiet < INTERVAL


async def test_no_kick_is_lost_and_sends_are_an_interval_apart_under_random_kicks() -> None:
    """Every kick is followed by a send that started at or after it; sends never come closer
    than the interval."""
    invokes = Invokes(seconds=INTERVAL / 3)  # sends overlapping the next interval, too
    kicker = AsyncKicker(invokes, INTERVAL)
    loop = asyncio.get_running_loop()
    rng = random.Random(7)
    kicked: list[float] = []
    for _ in range(120):
        await asyncio.sleep(rng.choice([0, 0, 0.001, 0.004, 0.02, INTERVAL * 1.3]))
        kicked.append(loop.time())
        kicker("orders")
    await settle(kicker)
    assert all(any(sent >= at for sent in invokes.at) for at in kicked), "a kick was lost"
    gaps = [b - a for a, b in zip(invokes.at, invokes.at[1:], strict=False)]
    assert min(gaps) >= INTERVAL - EARLY, f"two sends {min(gaps):.4f} s apart"
    span = invokes.at[-1] - invokes.at[0]
    assert len(invokes.at) <= span / INTERVAL + 1
    assert len(invokes.at) < len(kicked) / 2, "most kicks were folded into others"
    assert invokes.finished == kicker.sent == len(invokes.at)


async def test_flush_sends_the_waiting_kick_now_and_waits_for_every_send() -> None:
    invokes = Invokes(seconds=0.05)
    kicker = AsyncKicker(invokes, interval=60.0)  # a trailing send a minute away
    kicker("orders")
    kicker("orders")
    assert kicker.waiting
    await asyncio.wait_for(kicker.flush(), 5)
    assert not kicker.waiting
    assert (len(invokes.at), invokes.finished) == (2, 2), "both sent, and both returned"
    await kicker.flush()
    assert len(invokes.at) == 2, "a flush with nothing waiting sends nothing"


async def test_a_failing_invoke_is_logged_and_retried_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    invokes = Invokes(fail=2)
    kicker = AsyncKicker(invokes, INTERVAL)
    with caplog.at_level(logging.WARNING, "duly.kicks"):
        kicker("orders")  # the caller's commit succeeded: nothing may come back at it
        await asyncio.sleep(0)
        await settle(kicker)
    assert len(invokes.at) == 3, "two failures, each retried an interval later, then sent"
    assert (kicker.failed, invokes.finished, kicker.requested) == (2, 1, 1)
    assert "Could not invoke the wake function" in caplog.text

    always = Invokes(fail=1000)
    giving_up = AsyncKicker(always, 0.0)
    with caplog.at_level(logging.WARNING, "duly.kicks"):
        giving_up("orders")
        await wait_until(lambda: len(always.at) >= 1 + kicks.RETRIES)
        await giving_up.flush()
    assert len(always.at) == 1 + kicks.RETRIES, "retried RETRIES times, then left to the net"


async def test_kicks_from_another_thread_are_sent_on_the_kickers_loop() -> None:
    invokes = Invokes()
    kicker = AsyncKicker(invokes, INTERVAL)
    kicker("orders")
    threads = [threading.Thread(target=kicker, args=("orders",)) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)
    await asyncio.sleep(0.01)
    await settle(kicker)
    assert kicker.requested == 6
    assert len(invokes.at) == 2, "the thread's kicks were folded into one trailing send"


def test_a_kick_without_a_running_loop_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kicker = AsyncKicker(Invokes(), INTERVAL)
    with caplog.at_level(logging.WARNING, "duly.kicks"):
        kicker("orders")
    assert "no event loop" in caplog.text
    with pytest.raises(ValueError, match="at least 0"):
        AsyncKicker(Invokes(), -1)


def test_the_aws_invoke_names_the_missing_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DULY_WAKE_FUNCTION_ARN", raising=False)
    with pytest.raises(ConfigurationError, match="DULY_WAKE_FUNCTION_ARN"):
        aws_wake_invoke()

    class Lambda:
        def __init__(self) -> None:
            self.calls: list[dict[str, object]] = []

        def invoke(self, **call: object) -> None:
            self.calls.append(call)

    client = Lambda()
    arn = "arn:aws:lambda:us-east-1:123456789012:function:wake"
    monkeypatch.setenv("DULY_WAKE_FUNCTION_ARN", arn)
    invoke = aws_wake_invoke(client=client)

    async def kick() -> None:
        await invoke()

    asyncio.run(kick())
    assert client.calls == [
        {"FunctionName": arn, "InvocationType": "Event", "Payload": b'{"duly": "wake"}'}
    ]


async def test_start_run_and_deliver_kick_after_their_commit(db: Database) -> None:
    Session = await db.create(serverless.Base.metadata)
    seen: list[object] = []

    async def invoke() -> None:
        # What a wake invoked now would see, from its own connection.
        [(count,)] = await asyncio.to_thread(
            db.sql, "SELECT count(*) FROM serverless_reminder WHERE wake_at <= now()"
        )
        seen.append(count)

    async with connect_workflows(Session, workflows=[Reminder]) as connection:
        async with kick_wake_after_commits(connection, invoke, interval=0.0) as kicker:
            assert kicker in connection.kicks
            first = Reminder()
            assert await first.start(Reminder.plan)
            await kicker.flush()
            assert seen == [1], "the kick came after the row was committed"
            second = Reminder()
            await second.start(Reminder.plan)
            await Reminder.by(Reminder.id == first.id).run(Reminder.send)
            await kicker.flush()
            assert seen[1:] == [2, 2], "start and run each kicked, after committing"
            assert await Reminder.by(Reminder.id == -1).deliver(Reminder.send) == 0
            await kicker.flush()
            assert len(seen) == 3, "a delivery nobody accepted: no kick"
            assert await Reminder.by(Reminder.id == second.id).deliver(Reminder.send) == 1
            await kicker.flush()
            assert len(seen) == 4, "an accepted delivery kicked"
        assert kicker not in connection.kicks

        async with kick_wake_after_commits(connection, invoke, interval=60.0) as kicker:
            await Reminder().start(Reminder.plan)
            await Reminder().start(Reminder.plan)  # folded into a send a minute away
            assert kicker.waiting
        assert len(seen) == 6, "leaving the block sent the waiting kick"


async def test_an_aws_failure_after_a_commit_is_one_warning_and_one_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from botocore.exceptions import EndpointConnectionError
    from prometheus_client import REGISTRY

    def failed(call: str) -> float:
        return REGISTRY.get_sample_value("duly_failed_kicks_total", {"call": call}) or 0.0

    async def unreachable() -> None:
        raise EndpointConnectionError(endpoint_url="https://scheduler.eu-west-1.amazonaws.com/")

    async def database_down() -> None:
        raise ConnectionRefusedError("the database is down")

    before = failed("schedule")
    with caplog.at_level(logging.WARNING, "duly.kicks"):
        assert await kicks.survive_aws_call("schedule", unreachable, aws_errors_only=True) is False
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING and warning.exc_info is None
    assert warning.getMessage().startswith(
        "Could not register the next wake-up with EventBridge Scheduler: EndpointConnectionError"
    )
    assert failed("schedule") == before + 1
    with pytest.raises(ConnectionRefusedError):  # not AWS's: the caller's to handle
        await kicks.survive_aws_call("schedule", database_down, aws_errors_only=True)
    assert await kicks.survive_aws_call("kick", database_down) is False, "any error, for a kick"
    assert failed("schedule") == before + 1
