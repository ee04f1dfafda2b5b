"""Waiting for a run to end: woken by the end's NOTIFY, polling only behind a pooler.

`Model.by_key(k).wait(timeout)` answers with the ended row (finished, failed,
cancelled), at once for a run already ended, and raises `WaitTimeoutError`
past its timeout; the HTTP read `GET /workflows/{name}/runs/{key}?wait=S`
long-polls the same way, capped, and `duly show --wait S` too; behind PgBouncer in
transaction mode, where no notification reaches, the waiter reads its row every
`POLL_INTERVAL`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from engine import (
    InvalidArgumentError,
    NotFoundError,
    WaitTimeoutError,
    connect_workflows,
    run_workflows,
)
from engine.runs import waiting
from functions import examples
from functions.app import create_app
from functions.examples import Onboarding
from infra.testing.pytest_plugin import Server
from tests.apps import behaviour
from tests.apps.behaviour import Flaky, Timer
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, fetch, run_duly, serving, wait_until
from tests.pgbouncer import Bouncer, start_pgbouncer

pytestmark = pytest.mark.usefixtures("fresh_behaviour")

WELL_BEFORE_A_POLL = waiting.POLL_INTERVAL / 2  # an end heard, not found by a read


async def listening(Session: async_sessionmaker) -> bool:  # type: ignore[type-arg]
    """Whether a session of this database has run `LISTEN duly_ended` (a waiter's watch)."""
    async with Session() as session:
        found = await session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query = :listen"
            ),
            {"listen": waiting.LISTEN},
        )
    return bool(found)


async def armed(Session: async_sessionmaker, key: str) -> Timer:  # type: ignore[type-arg]
    """A Timer run started at `arm`, waiting a day to fire (a worker runs it)."""
    row = Timer(key=key)
    assert await row.start(Timer.arm)

    async def is_armed() -> bool:
        return (await fetch(Session, Timer, row.id)).next_step == "fire"

    await wait_until(is_armed)
    return row


async def test_a_waiter_is_woken_by_the_commit_that_ends_its_run(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        row = await armed(Session, "woken")
        waiter = asyncio.create_task(Timer.by_key(row.id).wait(timeout=20))
        await wait_until(lambda: listening(Session), what="the waiter's LISTEN")
        assert not waiter.done()
        ended = time.monotonic()
        assert await Timer.by(Timer.id == row.id).run(Timer.fire) == 1  # a worker ends it
        done = await waiter
        took = time.monotonic() - ended
    assert (done.fired, done.next_step, done.last_error) == (1, None, None), "the final row"
    assert took < WELL_BEFORE_A_POLL, f"woken {took:.3f} s after the end: by its NOTIFY"


async def test_a_run_already_ended_answers_at_once(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        row = Timer(key="done")
        assert await row.start(Timer.fire)

        async def finished() -> bool:
            return (await fetch(Session, Timer, row.id)).fired == 1

        await wait_until(finished)
        began = time.monotonic()
        done = await Timer.by_key(row.id).wait(timeout=0)
        assert time.monotonic() - began < WELL_BEFORE_A_POLL
    assert (done.fired, done.next_step) == (1, None)


async def test_a_wait_past_its_timeout_raises_with_the_run_as_it_stands(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Timer]):
        row = await armed(Session, "late")
        began = time.monotonic()
        with pytest.raises(WaitTimeoutError) as raised:
            await Timer.by_key(row.id).wait(timeout=0.4)
        took = time.monotonic() - began
    assert 0.4 <= took < 0.4 + WELL_BEFORE_A_POLL
    assert isinstance(raised.value, TimeoutError)
    assert raised.value.run.next_step == "fire", "the row as it stood at the timeout"


async def test_a_cancel_ends_the_wait(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):  # no worker: it stays at arm
        row = Timer(key="cancelled")
        assert await row.start(Timer.arm)
        waiter = asyncio.create_task(Timer.by_key(row.id).wait(timeout=20))
        await wait_until(lambda: listening(Session), what="the waiter's LISTEN")
        ended = time.monotonic()
        assert await Timer.by_key(row.id).cancel() == 1
        done = await waiter
        took = time.monotonic() - ended
    assert (done.next_step, done.last_error) == (None, "cancelled")
    assert took < WELL_BEFORE_A_POLL, f"woken {took:.3f} s after the cancel"


async def test_a_failure_ends_the_wait(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Flaky]):
        row = Flaky()
        assert await row.start(Flaky.returns("number"))  # not a directive: it fails, no retry
        waiter = asyncio.create_task(Flaky.by_key(row.id).wait(timeout=20))
        await asyncio.sleep(waiting.POLL_INTERVAL + 0.3)  # past any read a poll would make
        assert not waiter.done()
        began = time.monotonic()
        async with run_workflows(Session, workflows=[Flaky]):
            done = await waiter
        took = time.monotonic() - began
    assert took < 5, f"woken {took:.3f} s after the worker started: by the failure's NOTIFY"
    assert done.next_step is None
    assert done.last_error is not None and done.last_error.startswith("NotADirectiveError")


async def test_a_wait_refuses_a_bad_timeout_and_a_missing_run(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):
        for bad in (-1, float("nan"), float("inf")):
            with pytest.raises(InvalidArgumentError, match="number of seconds"):
                await Timer.by_key(1).wait(timeout=bad)
        with pytest.raises(NotFoundError, match="No Timer run matches"):
            await Timer.by_key(404).wait(timeout=1)


async def test_the_http_read_long_polls_until_the_end_or_its_bound(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        row = Timer(key="polled")
        assert await row.start(Timer.arm)
        path = f"/workflows/timer/runs/{row.id}"

        began = time.monotonic()
        bound = await client.get(path, params={"wait": "0.5"}, timeout=10)
        took = time.monotonic() - began
        assert bound.status_code == 200, bound.text
        assert bound.json()["row"]["next_step"] == "arm", "the run as it stands at the bound"
        assert 0.5 <= took < 0.5 + WELL_BEFORE_A_POLL

        polled = asyncio.create_task(client.get(path, params={"wait": "20"}, timeout=30))
        await wait_until(lambda: listening(Session), what="the long poll's LISTEN")
        assert not polled.done()
        ended = time.monotonic()
        assert await Timer.by_key(row.id).cancel() == 1
        early = await polled
        took = time.monotonic() - ended
        assert early.status_code == 200, early.text
        assert (early.json()["state"], early.json()["row"]["last_error"]) == ("cancelled",) * 2
        assert took < WELL_BEFORE_A_POLL, f"answered {took:.3f} s after the end"

        missing = await client.get("/workflows/timer/runs/404", params={"wait": "5"})
        assert missing.status_code == 404, missing.text

        for bad in ("31", "-1", "soon", "nan"):
            refused = await client.get(path, params={"wait": bad})
            assert refused.status_code == 422, (bad, refused.text)
            assert "wait" in refused.text


@pytest.fixture
def bouncer(db: Database, server: Server) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of this test's database."""
    with start_pgbouncer(db, server) as running:
        yield running


async def test_behind_pgbouncer_the_waiter_falls_back_to_bounded_polling(
    db: Database, bouncer: Bouncer
) -> None:
    await db.create(behaviour.Base.metadata)
    pooled = create_async_engine(bouncer.url, connect_args={"prepare_threshold": None})
    db.engines.append(pooled)
    Pooled = async_sessionmaker(pooled, expire_on_commit=False)
    async with connect_workflows(Pooled, workflows=[Timer]):
        row = Timer(key="pooled")
        assert await row.start(Timer.arm)
        waiter = asyncio.create_task(Timer.by_key(row.id).wait(timeout=20))
        await asyncio.sleep(waiting.PROBE_TIMEOUT + 0.3)  # its probe went unheard
        assert not waiter.done()
        assert not waiting._watch_of(pooled).heard, "no notification reaches through the pooler"
        assert await Timer.by_key(row.id).cancel() == 1
        ended = time.monotonic()
        done = await waiter
        took = time.monotonic() - ended
    assert done.last_error == "cancelled"
    assert took < waiting.POLL_INTERVAL + 0.5, "found by its next read"


async def test_duly_show_waits_for_the_end_or_its_bound(db: Database, tmp_path: Path) -> None:
    Session = await db.create(examples.Base.metadata)
    env = dev_env(tmp_path / "pg", DULY_APP="functions.examples", DULY_DATABASE_URL=db.url)
    async with serving(create_app(Session, run_worker=False)):  # nothing runs its steps
        row = Onboarding(user_id="u-wait", email="wait@example.com")
        assert await row.start(Onboarding.welcome)
        waited = await asyncio.to_thread(
            run_duly, "show", "onboarding", str(row.id), "--wait", "1", "--json",
            cwd=REPO_ROOT, env=env,
        )  # fmt: skip
        assert waited.returncode == 0, waited.stderr
        assert json.loads(waited.stdout)["state"] == "scheduled", "as it stands at the bound"

        began = time.monotonic()
        shown = asyncio.create_task(
            asyncio.to_thread(
                run_duly, "show", "onboarding", str(row.id), "--wait", "25", "--json",
                cwd=REPO_ROOT, env=env,
            )
        )  # fmt: skip
        await wait_until(lambda: listening(Session), timeout=20, what="the command's LISTEN")
        assert not shown.done()
        assert await Onboarding.by_key(row.id).cancel() == 1
        ended = await shown
        assert time.monotonic() - began < 15, "it answered at the end, not at its bound"
    assert ended.returncode == 0, ended.stderr
    assert json.loads(ended.stdout)["state"] == "cancelled"

    for bad in ("-1", "soon", "inf"):
        refused = run_duly("show", "onboarding", "1", "--wait", bad, cwd=REPO_ROOT, env=env)
        assert refused.returncode == 2
        assert "--wait: a number of seconds, 0 or more" in refused.stderr, refused.stderr
