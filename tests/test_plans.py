"""The claims and `next_due` reach a workflow table only through its indexes.

Each test fills a real table with enough rows that reading it whole costs
more than an index (most runs due, some sleeping, some leased, some
finished), ANALYZEs it, calls the real engine function while catching the
exact SQL and parameters it sends, and reads `EXPLAIN (FORMAT JSON)` of that
statement with those parameters. A Seq Scan of the workflow table makes a
statement cost as much as the table is long, however little is due.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, cast

import pytest
from sqlalchemy import Table
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.claims.claim import claim_due
from engine.claims.group_memory import WINDOW_PER_SLOT, GroupMemory
from engine.claims.limited import claim_limited
from engine.claims.next_due import next_due
from engine.model.registry import WorkflowInfo, workflow_info
from functions import examples
from functions.examples import Onboarding
from tests.apps import behaviour, limited
from tests.apps.behaviour import Timer
from tests.apps.limited import AT_MOST, Charge, Lookup, Render, WorkflowRate
from tests.conftest import Database
from tests.query_plans import (
    GROUPS,
    Plan,
    Sent,
    analyzed,
    drawn,
    fill_runs,
    nodes,
    plan_of,
    reached_by,
    sent,
    the_one,
)

WANT = 8
LEASE = timedelta(minutes=5)
BUCKET = cast(Table, WorkflowRate.__table__)

# The plain claim.


async def filled_timer(db: Database) -> AsyncEngine:
    """Many rows at rest (finished runs) and a few due: the due index holds only the due."""
    Session = await db.create(behaviour.Base.metadata)
    db.sql("INSERT INTO timer (fired) SELECT 1 FROM generate_series(1, 5000)")
    db.sql(
        "INSERT INTO timer (fired, next_step, next_args, wake_at) "
        "SELECT 0, 'fire', '{}'::json, now() FROM generate_series(1, 20)"
    )
    return analyzed(db, Session, "timer")


async def test_the_claim_uses_the_partial_due_index(db: Database) -> None:
    engine = await filled_timer(db)
    with sent(engine) as seen:
        async with engine.connect() as conn:
            assert len(await claim_due(conn, workflow_info(Timer), 8, LEASE)) == 8
            await conn.rollback()
    plan = await plan_of(engine, the_one(seen, "SKIP LOCKED"))
    # The due rows are found through the partial index, the rows to update by primary key.
    assert reached_by(plan, "timer") == {"ix_timer_due", "timer_pkey"}, drawn(plan)


async def test_the_claim_from_a_floor_uses_the_partial_due_index(db: Database) -> None:
    engine = await filled_timer(db)
    (floor,) = db.sql("SELECT now() - interval '1 second'")[0]
    with sent(engine) as seen:
        async with engine.connect() as conn:
            assert len(await claim_due(conn, workflow_info(Timer), 8, LEASE, floor=floor)) == 8
            await conn.rollback()
    plan = await plan_of(engine, the_one(seen, "SKIP LOCKED"))
    assert reached_by(plan, "timer") == {"ix_timer_due", "timer_pkey"}, drawn(plan)
    # Both ends of the range bound the index scan: below the floor is never read.
    (scan,) = [node for node in nodes(plan) if node.get("Index Name") == "ix_timer_due"]
    assert ">=" in scan["Index Cond"] and "<=" in scan["Index Cond"], drawn(plan)


async def filled_onboarding(db: Database) -> AsyncEngine:
    """Onboardings, a third of them scheduled to `welcome`, the rest to `check`."""
    Session = await db.create(examples.Base.metadata)
    columns = {"user_id": "'u' || i", "email": "'u' || i || '@example.com'"}
    columns |= {"nudges": "0", "status": "'waiting'"}
    fill_runs(db, "onboarding", columns, "CASE WHEN i % 3 = 0 THEN 'welcome' ELSE 'check' END")
    return analyzed(db, Session, "onboarding")


async def test_the_claim_of_every_step_or_of_a_lane_uses_the_partial_due_index(
    db: Database,
) -> None:
    engine = await filled_onboarding(db)
    info = workflow_info(Onboarding)
    for steps in (None, ("welcome",), ("activated", "welcome"), ("activated",)):
        with sent(engine) as seen:
            async with engine.connect() as conn:
                claimed = await claim_due(conn, info, WANT, LEASE, steps)
                assert len(claimed) == (0 if steps == ("activated",) else WANT)
                await conn.rollback()
        plan = await plan_of(engine, the_one(seen, "SKIP LOCKED"))
        # `next_step IN (...)` implies `next_step IS NOT NULL`: the partial index serves it
        # (a step no row is at is read through it whole, as a bitmap).
        ways = reached_by(plan, "onboarding")
        assert ways == {"ix_onboarding_due", "onboarding_pkey"}, (steps, drawn(plan))


# The limited claim: choose the groups, then claim their rows.

LOOKUP_CHOOSES = {"ix_lookup_due", "ix_lookup_due_by_customer", "ix_lookup_running_by_customer"}
LOOKUP_CLAIMS = {"ix_lookup_due_by_customer", "ix_lookup_running_by_customer", "lookup_pkey"}


async def filled_lookup(db: Database, hot_rows: int = 0) -> AsyncEngine:
    """Lookups of GROUPS customers; and `hot_rows` of one more, all due before any of theirs."""
    Session = await db.create(limited.Base.metadata)
    fill_runs(db, "lookup", {"customer": f"'c' || i % {GROUPS}"}, "'work'")
    db.sql(
        f"""
        INSERT INTO lookup (customer, next_step, next_args, wake_at)
        SELECT 'hot', 'work', '{{}}'::json, now() - interval '2 days' + i * interval '1 ms'
        FROM generate_series(1, {hot_rows}) AS i
        """
    )
    return analyzed(db, Session, "lookup")


async def limited_claim(
    engine: AsyncEngine,
    info: WorkflowInfo,
    steps: tuple[str, ...] | None = None,
    memory: GroupMemory | None = None,
) -> tuple[Sent, list[Row[Any]]]:
    """Run the real limited claim (it commits); what it sent and the rows it took."""
    with sent(engine) as seen:
        async with engine.connect() as conn:
            rows = await claim_limited(conn, info, WANT, LEASE, steps, BUCKET, memory)
    return seen, rows


def skip_scan_probes(plan: Plan, table: str, by: str) -> int:
    """How many probes the skip scan of every group made (the plan of an EXPLAIN ANALYZE)."""
    probes = [n for n in nodes(plan) if n.get("Alias") == f"later_{table}"]
    assert [n.get("Index Name") for n in probes] == [f"ix_{table}_due_by_{by}"], drawn(plan)
    return int(probes[0]["Actual Loops"])


async def test_the_limited_claim_of_the_oldest_rows_groups_uses_the_indexes(
    db: Database,
) -> None:
    engine = await filled_lookup(db)
    seen, rows = await limited_claim(engine, workflow_info(Lookup))
    assert len(rows) == WANT
    choose = await plan_of(engine, the_one(seen, "pg_try_advisory_xact_lock"), analyze=True)
    assert reached_by(choose, "lookup") == LOOKUP_CHOOSES, drawn(choose)
    # Enough of the oldest rows' groups can start: the skip scan of every group never runs.
    assert skip_scan_probes(choose, "lookup", "customer") == 0, drawn(choose)
    claim = await plan_of(engine, the_one(seen, "SKIP LOCKED"))
    assert reached_by(claim, "lookup") == LOOKUP_CLAIMS, drawn(claim)


async def test_the_limited_claim_that_visits_every_group_skip_scans_its_index(
    db: Database,
) -> None:
    # One customer's 5,000 rows are the oldest due: the prefix read sees only that customer,
    # which can start AT_MOST, fewer than wanted, so every group is visited.
    engine = await filled_lookup(db, hot_rows=5000)
    seen, rows = await limited_claim(engine, workflow_info(Lookup))
    assert len(rows) == WANT
    assert sum(row.customer == "hot" for row in rows) == AT_MOST
    choose = await plan_of(engine, the_one(seen, "pg_try_advisory_xact_lock"), analyze=True)
    assert reached_by(choose, "lookup") == LOOKUP_CHOOSES, drawn(choose)
    # One probe of the (customer, wake_at) index a group, and one finding no group past the last.
    assert skip_scan_probes(choose, "lookup", "customer") == GROUPS + 1, drawn(choose)
    claim = await plan_of(engine, the_one(seen, "SKIP LOCKED"))
    assert reached_by(claim, "lookup") == LOOKUP_CLAIMS, drawn(claim)


async def test_the_limited_claim_behind_a_backlog_probes_only_the_remembered_groups(
    db: Database,
) -> None:
    # The same customer ahead of everyone: the first claim visits every group and remembers
    # them; the next probes only the longest-waiting it remembers, one probe of the
    # (customer, wake_at) index each, and never the skip scan.
    engine = await filled_lookup(db, hot_rows=5000)
    memory = GroupMemory(clock=lambda: 0.0)
    await limited_claim(engine, workflow_info(Lookup), memory=memory)
    seen, rows = await limited_claim(engine, workflow_info(Lookup), memory=memory)
    assert len(rows) == WANT and memory.visits == 1
    choose = await plan_of(engine, the_one(seen, "pg_try_advisory_xact_lock"), analyze=True)
    assert reached_by(choose, "lookup") == LOOKUP_CHOOSES, drawn(choose)
    assert skip_scan_probes(choose, "lookup", "customer") == 0, drawn(choose)
    probes = [n for n in nodes(choose) if n.get("Alias") == "recalled"]
    assert [n.get("Index Name") for n in probes] == ["ix_lookup_due_by_customer"], drawn(choose)
    assert int(probes[0]["Actual Loops"]) == WANT * WINDOW_PER_SLOT, drawn(choose)


async def test_the_limited_claim_of_a_lane_uses_the_indexes(db: Database) -> None:
    Session = await db.create(limited.Base.metadata)
    columns = {"customer": f"'c' || i % {GROUPS}", "prepared": "true"}
    fill_runs(db, "render", columns, "CASE WHEN i % 3 = 0 THEN 'render' ELSE 'prepare' END")
    engine = analyzed(db, Session, "render")
    seen, rows = await limited_claim(engine, workflow_info(Render), ("render",))
    assert len(rows) == WANT and {row.next_step for row in rows} == {"render"}
    choose = await plan_of(engine, the_one(seen, "pg_try_advisory_xact_lock"))
    indexes = {"ix_render_due", "ix_render_due_by_customer", "ix_render_running_by_customer"}
    assert reached_by(choose, "render") == indexes, drawn(choose)
    claim = await plan_of(engine, the_one(seen, "SKIP LOCKED"))
    ways = {"ix_render_due_by_customer", "ix_render_running_by_customer", "render_pkey"}
    assert reached_by(claim, "render") == ways, drawn(claim)


async def filled_charge(db: Database) -> AsyncEngine:
    """Charges of GROUPS providers, every other provider's bucket empty."""
    Session = await db.create(limited.Base.metadata)
    fill_runs(db, "charge", {"provider": f"'p' || i % {GROUPS}", "charged": "0"}, "'charge'")
    db.sql(
        "INSERT INTO workflow_rate (workflow, group_key, tokens, refilled_at) "
        f"SELECT 'charge', 'p' || g, 0, now() FROM generate_series(0, {GROUPS - 1}, 2) AS g"
    )
    return analyzed(db, Session, "charge", "workflow_rate")


async def test_the_rate_limited_claim_uses_the_indexes(db: Database) -> None:
    engine = await filled_charge(db)
    seen, rows = await limited_claim(engine, workflow_info(Charge))
    assert len(rows) == WANT
    choose = await plan_of(engine, the_one(seen, "pg_try_advisory_xact_lock"))
    # No `at_most`: nothing counts running rows.
    indexes = {"ix_charge_due", "ix_charge_due_by_provider"}
    assert reached_by(choose, "charge") == indexes, drawn(choose)
    claim = await plan_of(engine, the_one(seen, "SKIP LOCKED"))
    ways = {"ix_charge_due_by_provider", "charge_pkey"}
    assert reached_by(claim, "charge") == ways, drawn(claim)


# When work is next due.


async def next_due_plan(
    engine: AsyncEngine, info: WorkflowInfo, steps: tuple[str, ...] | None = None
) -> Plan:
    """The plan of the statement `next_due` sends for one table."""
    with sent(engine) as seen:
        async with engine.connect() as conn:
            await next_due(conn, [info], [steps], BUCKET)
    return await plan_of(engine, the_one(seen, "min("))


async def test_next_due_of_a_plain_table_probes_the_partial_due_index(db: Database) -> None:
    engine = await filled_onboarding(db)
    for steps in (None, ("welcome",)):
        plan = await next_due_plan(engine, workflow_info(Onboarding), steps)
        assert reached_by(plan, "onboarding") == {"ix_onboarding_due"}, (steps, drawn(plan))


@pytest.mark.xfail(
    strict=True,
    reason="min(wake_at) WHERE next_step IN (a step no row is at) is planned as a Seq Scan",
)
async def test_next_due_of_a_lane_no_row_is_in_probes_the_partial_due_index(
    db: Database,
) -> None:
    engine = await filled_onboarding(db)
    plan = await next_due_plan(engine, workflow_info(Onboarding), ("activated",))
    assert reached_by(plan, "onboarding") == {"ix_onboarding_due"}, drawn(plan)


LIMITED = [
    pytest.param(filled_lookup, Lookup, LOOKUP_CHOOSES, id="at_most"),
    pytest.param(filled_charge, Charge, {"ix_charge_due", "ix_charge_due_by_provider"}, id="rate"),
]
Filling = Callable[[Database], Awaitable[AsyncEngine]]


@pytest.mark.parametrize(("filled", "model", "indexes"), LIMITED)
async def test_next_due_of_a_limited_table_uses_its_indexes(
    db: Database, filled: Filling, model: type[Any], indexes: set[str]
) -> None:
    engine = await filled(db)
    info = workflow_info(model)
    plan = await next_due_plan(engine, info)
    # `held` too: whether a row is due is asked of the due index, never by a scan.
    assert reached_by(plan, info.name) == indexes, drawn(plan)
