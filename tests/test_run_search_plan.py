"""A search's first page reads the workflow table through an index, whatever it filters on.

200,000 payments (tests/apps/search.py) written by one INSERT ... SELECT, then ANALYZEd, so
the planner would rather scan the table than use an index it does not need. For each kind of
filter the first page is read by `list_runs` while its SQL is caught, and each statement it
sent is EXPLAINed with its parameters: the engine's filters (state, step, waiting, error, key)
walk the primary key's index, a bound on an own column walks that column's index, a time
range (absolute, relative, `since:`) the time column's: test_each_filter_kind_reads_an_index;
a page after a cursor reads the same index from where the last ended.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from engine import connect_workflows
from engine.model.registry import workflow_info
from engine.views.filters import parse_filter
from engine.views.runs import list_runs
from tests.apps import search
from tests.conftest import Database
from tests.query_plans import drawn, plan_of, reached_by, sent

ROWS = 200_000
KEY = "payment_pkey"
AMOUNT = "ix_payment_amount"
CREATED = "ix_payment_created_at"


def fill(db: Database) -> None:
    """ROWS payments, one each 10 s up to now; amounts spread over 0 to 1,000; a run in 20
    scheduled (one in 3 of those at refund; one in 2 waits for refund, its timeout next), a run
    in 50 failed, one in 100 of those declined."""
    db.sql(
        f"""
        INSERT INTO payment (id, amount, created_at, customer, next_step, next_args, wake_at,
                             last_error, waiting_for)
        SELECT i, (i::bigint * 7919 % 100000) / 100.0, now() - ({ROWS} - i) * interval '10 seconds',
            'c' || (i % 1000),
            CASE WHEN i % 20 = 0 THEN CASE WHEN i % 3 = 0 THEN 'refund' ELSE 'charge' END END,
            CASE WHEN i % 20 = 0 THEN '{{}}'::json END,
            CASE WHEN i % 20 = 0 THEN now() + (i % 600) * interval '1 minute' END,
            CASE WHEN i % 5000 = 1 THEN 'CardError: card declined'
                 WHEN i % 50 = 1 THEN 'TimeoutError: the bank timed out' END,
            CASE WHEN i % 40 = 0 THEN 'refund' END
        FROM generate_series(1, {ROWS}) AS i
        """
    )
    db.sql("ANALYZE payment")


async def test_each_filter_kind_reads_an_index(db: Database) -> None:
    Session = await db.create(search.Base.metadata)
    fill(db)
    [(middle,)] = db.sql("SELECT created_at FROM payment WHERE id = %s", ROWS // 2)
    assert isinstance(middle, datetime)
    engine: Any = Session.kw["bind"]
    info = workflow_info(search.Payment)
    cases = {
        "": {KEY},
        "state:failed": {KEY},
        "step:refund": {KEY},
        "waiting:refund": {KEY},
        'error:"card declined"': {KEY},
        "key:12345": {KEY},
        "id>150000": {KEY},
        "amount!=5": {KEY},
        "amount>=900": {AMOUNT},
        "amount<5 state:failed": {AMOUNT},
        "amount=123.45": {AMOUNT},
        f"created_at<={middle.isoformat()}": {CREATED},
        "created_at>=-1h": {CREATED},
        "state:failed since:1h": {CREATED},
        "step:charge since:2d": {CREATED},
    }
    async with connect_workflows(Session) as connection:
        for text, expected in cases.items():
            with sent(engine) as seen:
                page = await list_runs(connection, info, parse_filter(info, text))
            assert page.runs, text
            statements = [s for s in seen if "FROM payment" in s[0]]
            assert statements, text
            # The page, and for a sparse filter where its search window ends.
            for statement in statements:
                plan = await plan_of(engine, statement)
                ways = reached_by(plan, "payment")
                assert ways == expected, (text, drawn(plan))
            if page.next_after is None:
                continue
            # The next page goes on through the same index, from the cursor.
            with sent(engine) as seen:
                after = await list_runs(
                    connection, info, parse_filter(info, text), after=page.next_after
                )
            assert {r.key for r in after.runs}.isdisjoint(r.key for r in page.runs), text
            for statement in [s for s in seen if "FROM payment" in s[0]]:
                plan = await plan_of(engine, statement)
                assert reached_by(plan, "payment") == expected, (text, drawn(plan))
