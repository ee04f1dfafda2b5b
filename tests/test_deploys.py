"""Deploys never strand a run: workers of two releases side by side, renamed steps, old arguments.

- Two worker processes of different releases (one has `review`, the other
  only `review_v2` with `aliases=("review",)`) over rows of both: each takes
  only the steps it has, nothing fails or retries, every row finishes, and
  the attempt log names the step that ran by the name it had in its code.
- A row naming a step no worker has is never run and its attempts never
  move; after the grace period (moved clock) it is reported stranded, by
  `engine.claims.stranded` and by the worker that handed it back (log and gauge);
  `by(...).run(...)` then finishes it.
- A row handed back keeps its wake_at (its age), and the worker does not
  come back to it: no busy loop.
- A handed-back row of a limited table does not count as running.
- Stored arguments that no longer bind: one failed attempt saying so, the
  run stopped, whatever the retry policy; a TypeError inside a body whose
  arguments bind still follows the retry policy.
- A renamed step's retry names the step by its new name.
- A run parked on a step's former name takes an event addressed to the step
  by its new name.
- Aliases that would make a name ambiguous are refused when the class is mapped.
- The stranded report reads only the due index.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import String, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import ConfigurationError, Workflow, connect_workflows, run_workflows, step
from engine.claims.claim import served_steps
from engine.claims.stranded import (
    STRANDED_AFTER,
    StrandedRuns,
    stranded_after,
    stranded_in,
    stranded_runs,
    stranded_statement,
)
from engine.model import telemetry
from engine.model.registry import workflow_info
from engine.testing import drain, move_clock
from tests.apps import deploy_new, deploy_old, limited
from tests.apps.deploy_new import Order as NewOrder
from tests.apps.deploy_old import Order as OldOrder, OrderAttempt
from tests.apps.limited import Render
from tests.conftest import Database
from tests.helpers import fetch, wait_until
from tests.processes.conftest import WorkerProcesses
from tests.query_plans import analyzed, drawn, fill_runs, plan_of, reached_by, sent, the_one

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 20.0  # seconds for a worker process to start
BATCH = 30  # runs started in each phase of the rolling deploy
HANDED_BACK = "which this code's Order does not have"  # the worker's warning, once a step


class Releases(WorkerProcesses):
    """Worker processes of one release or the other, their logs kept, every one reaped."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "marks")
        self.folder = folder

    def start_release(self, url: str, release: str) -> subprocess.Popen[str]:
        log = self.folder / f"{release}.log"
        return self.start(url, release, module="tests.apps.deploy_worker", log=log)

    def stop(self, process: subprocess.Popen[str], timeout: float = 20.0) -> int:
        code = super().stop(process, timeout)
        assert code == 0
        return code

    def log(self, release: str) -> str:
        return (self.folder / f"{release}.log").read_text()


@pytest.fixture
def releases(tmp_path: Path) -> Iterator[Releases]:
    processes = Releases(tmp_path)
    try:
        yield processes
    finally:
        processes.kill_all()


async def finished(Session: async_sessionmaker[AsyncSession], ids: list[int]) -> bool:
    async with Session() as session:
        left = await session.scalar(
            select(func.count())
            .select_from(OldOrder)
            .where(OldOrder.id.in_(ids), OldOrder.next_step.isnot(None))
        )
    return left == 0


async def start_runs(ids: list[int], renamed: bool = False) -> dict[int, Any]:
    """Runs of `ids`: odd ids at `review` (the old release's name), even ones at `review_v2`
    (started by the new release), or all at `review` unless `renamed`; each one's wake_at."""
    due: dict[int, Any] = {}
    for i in ids:
        if renamed and i % 2 == 0:
            row: Any = NewOrder(id=i)
            assert await row.start(NewOrder.review_v2(f"new-{i}"))
        else:
            row = OldOrder(id=i)
            assert await row.start(OldOrder.review(f"old-{i}"))
        due[i] = row.wake_at
    return due


async def test_two_releases_side_by_side_each_run_only_the_steps_they_have(
    db: Database, releases: Releases
) -> None:
    Session = await db.create(deploy_old.Base.metadata)
    first = list(range(1, BATCH + 1))
    second = list(range(BATCH + 1, 2 * BATCH + 1))
    third = list(range(2 * BATCH + 1, 3 * BATCH + 1))
    renamed = [i for i in first + second if i % 2 == 0]
    old = releases.start_release(db.url, "old")
    async with connect_workflows(Session, workflows=[OldOrder]):
        # The deploy begins: the new release's web process starts runs at review_v2 while
        # only old workers run. They run theirs, and leave review_v2 alone.
        due = await start_runs(first, renamed=True)
        await wait_until(lambda: finished(Session, [i for i in first if i % 2]), timeout=20)
        await wait_until(lambda: HANDED_BACK in releases.log("old"), timeout=10)
        for i in (i for i in first if i % 2 == 0):
            waiting = await fetch(Session, OldOrder, i)
            assert (waiting.next_step, waiting.attempts, waiting.claimed_until) == (
                "review_v2",
                0,
                None,
            )
            assert waiting.wake_at == due[i], "handed back as it was: due since it started"
        # New workers come up beside the old: both run, each what it has.
        new = releases.start_release(db.url, "new")
        await start_runs(second, renamed=True)
        await wait_until(lambda: finished(Session, first + second), timeout=30)
        # The old workers go; runs still started at review are the new release's, by alias.
        releases.stop(old)
        await start_runs(third)
        await wait_until(lambda: finished(Session, third), timeout=20)
        releases.stop(new)

    async with Session() as session:
        rows = {row.id: row for row in (await session.scalars(select(OldOrder))).all()}
        log = (await session.scalars(select(OrderAttempt))).all()
    assert len(rows) == 3 * BATCH
    assert all(
        (r.next_step, r.attempts, r.last_error, r.claimed_until) == (None, 0, None, None)
        for r in rows.values()
    ), "every run finished at its first attempt"
    assert {rows[i].ran_by for i in renamed} == {"new"}, "only the new release has review_v2"
    assert {rows[i].ran_by for i in first if i % 2} == {"old"}
    assert {rows[i].ran_by for i in third} == {"new"}, "review runs as review_v2, by its alias"
    assert sorted(int(entry.run_key) for entry in log) == sorted(rows), "one attempt a run"
    assert {entry.outcome for entry in log} == {"ok"}
    steps = {int(entry.run_key): entry.step for entry in log}
    assert all(steps[i] == ("review" if rows[i].ran_by == "old" else "review_v2") for i in rows), (
        "the attempt log names the step that ran, as its code named it"
    )
    old_log, new_log = releases.log("old"), releases.log("new")
    assert old_log.count(HANDED_BACK) == 1, old_log
    assert "'review_v2'" in old_log
    assert HANDED_BACK not in new_log and "attempt" not in new_log + old_log


def insert_order(db: Database, id: int, step: str, args: str, due: str = "now()") -> None:
    """A run written as an earlier release left it: at `step` with `args` (JSON), due at `due`."""
    db.sql(
        "INSERT INTO deploy_order (id, ran_by, reviewer, tallied, next_step, next_args, wake_at,"
        f" attempts, wf_version) VALUES (%s, '', '', 0, %s, %s::json, {due}, 0, 0)",
        id,
        step,
        args,
    )


def stranded_gauge(step: str) -> float | None:
    value: float | None = REGISTRY.get_sample_value(
        "duly_stranded_runs", {"workflow": "deploy_order", "step": step}
    )
    return value


async def test_a_step_no_worker_has_is_never_run_and_is_reported_stranded_after_the_grace(
    db: Database, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DULY_STRANDED_AFTER_SECONDS", raising=False)  # the default grace
    Session = await db.create(deploy_old.Base.metadata)
    insert_order(db, 1, "audit", '{"args": [], "kwargs": {}}')
    info = workflow_info(OldOrder)
    caplog.set_level(logging.WARNING, logger="duly.worker")
    async with run_workflows(Session, workflows=[OldOrder]) as worker:
        await wait_until(lambda: worker.served["deploy_order"] is not None)
        row = await fetch(Session, OldOrder, 1)
        assert (row.next_step, row.attempts, row.last_error, row.claimed_until) == (
            "audit",
            0,
            None,
            None,
        )
        warned = [r.getMessage() for r in caplog.records if "'audit'" in r.getMessage()]
        assert len(warned) == 1 and "Order does not have" in warned[0], warned
        async with db.engine().connect() as conn:
            assert await stranded_in(conn, info, STRANDED_AFTER) == [], "not yet: a grace period"

        await move_clock(Session, STRANDED_AFTER + timedelta(minutes=1))
        # The world goes on: the worker reads the database's time from its next claim.
        other = OldOrder(id=2)
        assert await other.start(OldOrder.review("ann"))
        await wait_until(lambda: any("have been due" in r.getMessage() for r in caplog.records))
        reported = [r.getMessage() for r in caplog.records if "have been due" in r.getMessage()]
        assert len(reported) == 1 and "1 run(s)" in reported[0] and "'audit'" in reported[0]
        assert telemetry.METRICS, "the tests install prometheus-client"
        assert stranded_gauge("audit") == 1
        assert (await fetch(Session, OldOrder, 1)).attempts == 0

        assert row.wake_at is not None
        async with connect_workflows(Session, workflows=[OldOrder]) as connection:
            found = await stranded_runs(connection)
            assert found == [StrandedRuns("deploy_order", "audit", 1, row.wake_at)]
            assert found[0].to_dict()["since"] == row.wake_at.isoformat()
            # The operator resolves it with a step the code has.
            assert await OldOrder.by(OldOrder.id == 1).run(OldOrder.review("bob")) == 1
            await wait_until(lambda: finished(Session, [1, 2]))
            assert await stranded_runs(connection) == []
            done = await fetch(Session, OldOrder, 1)
            assert [(h.step, h.outcome) for h in await done.history()] == [("review", "ok")]
    assert (done.ran_by, done.reviewer, done.attempts, done.last_error) == ("old", "bob", 0, None)


async def test_a_handed_back_row_keeps_its_age_and_is_not_claimed_again(db: Database) -> None:
    Session = await db.create(deploy_old.Base.metadata)
    insert_order(db, 1, "audit", "{}", due="now() - interval '1 hour'")
    (due_since,) = db.sql("SELECT wake_at FROM deploy_order WHERE id = 1")[0]
    async with run_workflows(
        Session,
        workflows=[OldOrder],
        poll_interval=timedelta(milliseconds=50),
        max_idle_interval=timedelta(seconds=30),
    ) as worker:
        await wait_until(lambda: worker.served["deploy_order"] is not None)
        assert worker.served["deploy_order"] == ("review", "tally")
        # The NOTIFY of its own hand-back comes and goes: a later look is caught up.
        assert await worker.wake(5), "nothing it can run is due"
        passes = worker.passes
        await asyncio.sleep(1.0)  # the claim is how often it looks in this time
        looks = worker.passes - passes
    # A worker that still saw the row as due would look every 50 ms: twenty times.
    assert looks <= 2, f"no busy loop on a row it cannot run: {looks} passes"
    row = await fetch(Session, OldOrder, 1)
    assert row.wake_at == due_since, "its age is kept: it says how long it has waited"
    assert (row.next_step, row.attempts, row.claimed_until, row.last_error) == (
        "audit",
        0,
        None,
        None,
    )
    assert row.wf_version == 1, "claimed once, never again"


async def test_a_handed_back_row_of_a_limited_table_does_not_count_as_running(
    db: Database,
) -> None:
    Session = await db.create(limited.Base.metadata)
    # One render at a time per customer: the oldest due row of the group is the unknown one.
    db.sql(
        "INSERT INTO render (id, customer, prepared, next_step, next_args, wake_at, attempts,"
        " wf_version) VALUES (1, 'c', false, 'retired', '{}', now() - interval '1 minute', 0, 0),"
        " (2, 'c', false, 'prepare', '{}', now(), 0, 0)"
    )
    async with run_workflows(
        Session, workflows=[Render], lanes=["default", "media"], lease=timedelta(minutes=1)
    ):

        async def rendered() -> bool:
            return (await fetch(Session, Render, 2)).ended is not None

        # A row left leased would hold the group for the minute of its lease.
        began = time.monotonic()
        await wait_until(rendered, timeout=30)
        took = time.monotonic() - began
    assert took < 10, f"the group was free at once, not after the lease: {took:.1f} s"
    left = await fetch(Session, Render, 1)
    assert (left.next_step, left.attempts, left.claimed_until) == ("retired", 0, None)


async def test_stored_arguments_that_no_longer_fit_fail_once_and_stop_the_run(
    db: Database,
) -> None:
    Session = await db.create(deploy_old.Base.metadata)
    # review(self, reviewer) was review(self, reviewer, note), or took no reviewer.
    insert_order(db, 1, "review", '{"args": [], "kwargs": {"reviewer": "ann", "note": "rush"}}')
    insert_order(db, 2, "review", '{"args": [], "kwargs": {}}')
    # A bug in tally's body raises TypeError with arguments that fit: the policy decides.
    insert_order(db, 3, "tally", '{"args": [2], "kwargs": {}}')
    assert await drain(Session, [OldOrder]) == 3
    async with connect_workflows(Session, workflows=[OldOrder]):
        extra, missing, buggy = [await fetch(Session, OldOrder, i) for i in (1, 2, 3)]
        for row in (extra, missing):
            assert (row.next_step, row.attempts, row.claimed_until) == (None, 1, None)
            assert row.last_error is not None
            assert row.last_error.startswith(
                "StepError: Stored arguments for Order.review no longer fit its signature ("
            ), row.last_error
            assert "review(self, reviewer: str)" in row.last_error
            assert "by(...).run(Order.review(...)) or cancel()" in row.last_error
            assert [(h.step, h.outcome) for h in await row.history()] == [("review", "failed")]
        assert extra.last_error is not None and missing.last_error is not None
        assert "args=[], kwargs={" in extra.last_error and "'note': 'rush'" in extra.last_error
        assert "unexpected keyword argument 'note'" in extra.last_error
        assert "missing a required argument: 'reviewer'" in missing.last_error
        assert (buggy.next_step, buggy.attempts) == ("tally", 1), "retried, as its policy says"
        assert buggy.last_error is not None and buggy.last_error.startswith("TypeError: ")
        assert [(h.step, h.outcome) for h in await buggy.history()] == [("tally", "retry")]
    assert await drain(Session, [OldOrder]) == 0, "no backoff loop: the stopped runs are done"


async def test_a_renamed_steps_retry_carries_its_new_name(db: Database) -> None:
    Session = await db.create(deploy_new.Base.metadata)
    insert_order(db, 1, "review", '{"args": ["nobody"], "kwargs": {}}')
    assert await drain(Session, [NewOrder]) == 1
    async with connect_workflows(Session, workflows=[NewOrder]):
        row = await fetch(Session, NewOrder, 1)
        assert (row.next_step, row.attempts) == ("review_v2", 1)
        assert row.next_args == {"args": ["nobody"], "kwargs": {}}
        assert [(h.step, h.outcome) for h in await row.history()] == [("review_v2", "retry")]


async def test_a_run_parked_on_a_former_name_takes_the_event_by_the_new_name(
    db: Database,
) -> None:
    Session = await db.create(deploy_new.Base.metadata)
    # Parked by the earlier release on `review`, which this one calls `review_v2`.
    db.sql(
        "INSERT INTO deploy_order (id, ran_by, reviewer, tallied, waiting_for, attempts, "
        "wf_version) VALUES (1, '', '', 0, 'review', 0, 0)"
    )
    async with connect_workflows(Session, workflows=[NewOrder]):
        taken = await NewOrder.by(NewOrder.id == 1).deliver(NewOrder.review_v2("kim"))
        assert taken == 1, "the old name is the same step"
        assert await drain(Session, [NewOrder]) == 1
        row = await fetch(Session, NewOrder, 1)
        assert (row.reviewer, row.ran_by) == ("kim", "new")
        assert (row.next_step, row.waiting_for) == (None, None)


def test_a_renamed_step_is_found_by_both_names_and_served_by_both() -> None:
    info = workflow_info(NewOrder)
    assert info.resolve("review") is NewOrder.review_v2
    assert info.resolve("review_v2") is NewOrder.review_v2
    assert info.resolve("audit") is None and info.resolve(None) is None
    assert list(info.steps) == ["review_v2"], "steps by their names only"
    lanes = frozenset({"default"})
    assert served_steps(info, lanes) is None
    assert served_steps(info, lanes, listed=True) == ("review", "review_v2")
    assert served_steps(info, frozenset({"media"})) == ()


def test_aliases_that_make_a_name_ambiguous_are_refused() -> None:
    class Base(DeclarativeBase):
        pass

    with pytest.raises(ConfigurationError, match=r"step Shared\.ship has that name"):

        class Shared(Base, Workflow):
            __tablename__ = "alias_shared"
            id: Mapped[int] = mapped_column(primary_key=True)

            @step(aliases=("ship",))
            async def pack(self) -> None: ...

            @step
            async def ship(self) -> None: ...

    with pytest.raises(ConfigurationError, match=r"already an alias of Twice\.pack"):

        class Twice(Base, Workflow):
            __tablename__ = "alias_twice"
            id: Mapped[int] = mapped_column(primary_key=True)

            @step(aliases=("prepare",))
            async def pack(self) -> None: ...

            @step(aliases=("prepare",))
            async def wrap(self) -> None: ...

    with pytest.raises(ConfigurationError, match="its own name"):

        class Own(Base, Workflow):
            __tablename__ = "alias_own"
            id: Mapped[int] = mapped_column(primary_key=True)

            @step(aliases=("pack",))
            async def pack(self) -> None: ...

    with pytest.raises(ConfigurationError, match=r"aliases=\('pack',\)"):
        step(aliases="pack")
    with pytest.raises(ConfigurationError, match="twice"):
        step(aliases=("pack", "pack"))
    with pytest.raises(ConfigurationError, match="former name"):
        step(aliases=("",))


def test_the_grace_period_is_a_setting() -> None:
    assert stranded_after({}) == timedelta(minutes=15)
    assert stranded_after({"DULY_STRANDED_AFTER_SECONDS": "90"}) == timedelta(seconds=90)
    for wrong in ("0", "-5", "soon", "inf", "nan"):
        with pytest.raises(ConfigurationError, match="DULY_STRANDED_AFTER_SECONDS"):
            stranded_after({"DULY_STRANDED_AFTER_SECONDS": wrong})


async def test_the_stranded_report_reads_only_the_due_index(db: Database) -> None:
    class Base(DeclarativeBase):
        pass

    class Parcel(Base, Workflow):
        __tablename__ = "parcel"
        id: Mapped[int] = mapped_column(primary_key=True)
        label: Mapped[str] = mapped_column(String(40))

        @step
        async def ship(self) -> None: ...

    Session = await db.create(Base.metadata)
    steps = "CASE WHEN i % 3 = 0 THEN 'ship' ELSE 'gone' END"
    fill_runs(db, "parcel", {"label": "'p' || i"}, steps)
    engine = analyzed(db, Session, "parcel")
    info = workflow_info(Parcel)
    for steps in (None, ("gone",)):
        with sent(engine) as seen:
            async with engine.connect() as conn:
                found = await stranded_in(conn, info, STRANDED_AFTER, steps)
        assert {f.step for f in found} == ({"ship", "gone"} if steps is None else {"gone"})
        plan = await plan_of(engine, the_one(seen, "GROUP BY"))
        assert reached_by(plan, "parcel") == {"ix_parcel_due"}, (steps, drawn(plan))
    assert stranded_statement(info, None) is stranded_statement(info, None), "built once"
