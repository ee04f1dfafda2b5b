"""fan_out: children start in the parent's commit; the parent's `then` runs once, after all."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from engine import connect_workflows, run_workflows
from engine.claims.claim import Claim, claim_due
from engine.commits.outcomes import Outcome, Write
from engine.model.registry import workflow_info
from engine.runs.fanout import child, fan_out
from engine.testing import drain, move_clock
from engine.worker.committer import Committer
from functions import examples
from functions.examples import Lookup, Research
from tests.conftest import Database
from tests.helpers import fetch, wait_until

BOTH = [Research, Lookup]


@pytest.fixture(autouse=True)
def providers_up() -> None:
    examples.unreachable_companies.clear()


async def lookups(Session) -> int:  # type: ignore[no-untyped-def]
    async with Session() as session:
        return int(await session.scalar(select(func.count()).select_from(Lookup)) or 0)


async def test_research_example_reports_once_every_lookup_has_finished(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    examples.unreachable_companies.add("Initech")
    async with run_workflows(Session, workflows=BOTH):
        research = Research(name="q3", companies=["Acme", "Globex", "Initech"])
        assert await research.start(Research.research_all)

        async def lookups_tried() -> bool:
            return await lookups(Session) == 3

        await wait_until(lookups_tried)
        assert (await fetch(Session, Research, research.id)).found is None
        # Initech's provider is down: it retries by itself (30 s, then 60 s) and gives up.
        for failures, wait in ((1, 30), (2, 60)):

            async def failed(n: int = failures) -> bool:
                rows = await Lookup.by(Lookup.company == "Initech").all()
                return bool(rows) and rows[0].attempts == n and rows[0].claimed_until is None

            await wait_until(failed)
            await move_clock(Session, timedelta(seconds=wait))

        async def reported() -> bool:
            return (await fetch(Session, Research, research.id)).found is not None

        await wait_until(reported)
        stored = await fetch(Session, Research, research.id)
        children = await research.children(Lookup).all()
    assert stored.found == 2 and stored.next_step is None and stored.children_left == 0
    assert sorted(c.company for c in children) == ["Acme", "Globex", "Initech"]
    assert [c.last_error is not None for c in sorted(children, key=lambda c: c.company)] == [
        False,
        False,
        True,
    ]


async def test_a_child_that_hits_a_unique_constraint_is_not_started_and_not_counted(
    db: Database,
) -> None:
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session, workflows=BOTH):
        first = Research(name="same", companies=["Acme", "Globex"])
        assert await first.start(Research.research_all)
        await drain(Session, BOTH)
        again = Research(name="same", companies=["Acme", "Globex", "Hooli"])
        assert await again.start(Research.research_all)
        await drain(Session, BOTH)
        assert await lookups(Session) == 3, "one run per key"
        assert (await fetch(Session, Research, again.id)).found == 1, "only Hooli was its own"


async def test_children_with_the_same_key_in_one_fan_out_start_once(db: Database) -> None:
    """The children go in as one multi-row insert: a key repeated inside it starts one run."""
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session, workflows=BOTH):
        twice = Research(name="twice", companies=["Acme", "Acme", "Globex"])
        assert await twice.start(Research.research_all)
        await drain(Session, BOTH)
        assert await lookups(Session) == 2
        stored = await fetch(Session, Research, twice.id)
    assert stored.found == 2 and stored.next_step is None and stored.children_left == 0


async def test_a_fan_out_with_no_new_children_runs_then_at_once(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session, workflows=BOTH):
        empty = Research(name="none", companies=[])
        assert await empty.start(Research.research_all)
        await drain(Session, BOTH)
        stored = await fetch(Session, Research, empty.id)
    assert stored.found == 0 and stored.next_step is None


async def test_a_cancelled_child_counts_as_finished_to_its_parent(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    examples.unreachable_companies.update({"Acme", "Globex"})
    async with connect_workflows(Session, workflows=BOTH):
        research = Research(name="cancel", companies=["Acme", "Globex"])
        assert await research.start(Research.research_all)
        await drain(Session, BOTH)
        assert (await fetch(Session, Research, research.id)).children_left == 2
        assert await Lookup.by(Lookup.company == "Acme").cancel() == 1
        assert (await fetch(Session, Research, research.id)).children_left == 1
        assert await research.children(Lookup).cancel() == 1
        await drain(Session, BOTH)
        stored = await fetch(Session, Research, research.id)
    assert stored.found == 0 and stored.next_step is None


async def test_a_parent_whose_row_was_taken_over_starts_no_children(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with connect_workflows(Session, workflows=BOTH):
        research = Research(name="fenced", companies=["Acme"])
        assert await research.start(Research.research_all)
        # Claim it as a worker would, then let another take it over before the commit.

        info = workflow_info(Research)
        engine = Session.kw["bind"]
        async with engine.begin() as conn:
            (claimed,) = await claim_due(conn, info, 1, timedelta(minutes=5))
        db.sql("UPDATE research SET wf_version = wf_version + 1")  # taken over
        committer = Committer(
            engine.execution_options(isolation_level="AUTOCOMMIT"),
            None,
            timedelta(minutes=5),
            engine,
        )
        committer.start()
        fan = fan_out(
            [child(Lookup(key="fenced:Acme", customer="fenced", company="Acme"), Lookup.research)],
            then=Research.report,
        )
        written = await committer.write(
            Write(
                Claim(info, (claimed.id,), claimed.wf_version), Outcome("report", {}), fan_out=fan
            )
        )
        await committer.stop()
    assert written is None
    assert await lookups(Session) == 0
