"""The console's queries reach the tables only through their indexes, never a read of all rows.

The overview is asked every 2 s while someone looks, and a runs page is
asked for any page of 100,000 runs: each must cost what it shows, not what
the table holds. Each test fills a real table as a busy deployment's looks
(nearly every run ended long ago, some live), ANALYZEs it, runs the real
function while catching the SQL it sends, and reads `EXPLAIN (FORMAT JSON)`
of each statement with its parameters (tests/test_plans.py's helpers).

- the overview's live counts read the due index, its resting counts the
  newest rows through the primary key, the outbox's open rows its status
  index: test_the_overview_reads_through_indexes
- a runs page, newest first, with or without a filter or a cursor, reads the
  primary key's index: test_newest_runs_are_read_through_the_primary_key
- a runs page, soonest first, reads the due index (its cursor a range of
  it), and the rest through the primary key: test_soonest_runs_are_read_through_the_due_index
- the last hour's activity reads the attempt log through its key (or an
  index on its time), and a run's newest attempts through the run's index:
  test_the_activity_and_a_runs_attempts_read_through_indexes
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import connect_workflows
from engine.events.records import tables_for
from engine.model.registry import workflow_info
from engine.views.activity import activity
from engine.views.overview import overview
from engine.views.run import run_detail
from engine.views.runs import RunFilter, list_runs, parse_key
from functions import examples
from functions.examples import Onboarding, Outbox
from tests.conftest import Database
from tests.query_plans import Plan, Sent, drawn, plan_of, reached_by, sent

ROWS = 20_000
LOG_ROWS = 30_000
SCHEDULED_EVERY = 40  # one run in 40 has a step scheduled; the rest ended
EVENTS = 20_000


async def filled(db: Database) -> tuple[async_sessionmaker[AsyncSession], AsyncEngine]:
    """Onboardings nearly all ended (some failed), one in 40 scheduled (a few leased or
    waiting with a timeout); an attempt log over the last three hours; an outbox nearly all
    processed."""
    Session = await db.create(examples.Base.metadata)
    db.sql(
        f"""
        INSERT INTO onboarding (user_id, email, nudges, status, next_step, next_args, wake_at,
                                claimed_until, waiting_for, attempts, last_error)
        SELECT 'u' || i, 'u' || i || '@example.com', 0, 'x',
            CASE WHEN live THEN 'check' END,
            CASE WHEN live THEN '{{}}'::json END,
            CASE WHEN live THEN now() + (i % 500 - 250) * interval '1 minute' END,
            CASE WHEN live AND i % 7 = 0 THEN now() + interval '5 minutes' END,
            CASE WHEN live AND i % 11 = 0 THEN 'activated' END,
            CASE WHEN live AND i % 13 = 0 THEN 2 ELSE 0 END,
            CASE WHEN NOT live AND i % 17 = 0 THEN 'ValueError: no such user' END
        FROM (SELECT i, i % {SCHEDULED_EVERY} = 0 AS live
              FROM generate_series(1, {ROWS}) AS i) AS runs
        """
    )
    db.sql(
        f"""
        INSERT INTO workflow_attempt (workflow, run_key, step, attempt, outcome, error, took_ms,
                                      finished_at)
        SELECT 'onboarding', (i % {ROWS} + 1)::text, 'check', 1,
            CASE WHEN i % 50 = 0 THEN 'retry' ELSE 'ok' END, NULL, 1.5,
            now() - interval '3 hours' + i * (interval '3 hours' / {LOG_ROWS})
        FROM generate_series(1, {LOG_ROWS}) AS i
        """
    )
    db.sql(
        f"""
        INSERT INTO duly_outbox (event_id, event_type, event_name, status, route_attempts,
                                 created_at, next_step, next_args, wake_at)
        SELECT 'e' || i, 'x', '', CASE WHEN i % 500 = 0 THEN 'dead_letter'
                                       WHEN i % 499 = 0 THEN 'pending' ELSE 'processed' END,
            0, now() - interval '1 day' + i * interval '1 second',
            CASE WHEN i % 499 = 0 THEN 'route' END,
            CASE WHEN i % 499 = 0 THEN '{{}}'::json END,
            CASE WHEN i % 499 = 0 THEN now() END
        FROM generate_series(1, {EVENTS}) AS i
        """
    )
    db.sql("ANALYZE onboarding, workflow_attempt, duly_outbox")
    engine: AsyncEngine = Session.kw["bind"]
    return Session, engine


def plans_of(seen: Sent, marker: str) -> list[tuple[str, Any]]:
    """Every statement sent that mentions `marker`."""
    found = [(statement, parameters) for statement, parameters in seen if marker in statement]
    assert found, [statement for statement, _ in seen]
    return found


def no_seq_scan(plan: Plan, table: str) -> set[str]:
    """How the plan reads `table`, checked to be index scans only."""
    ways = reached_by(plan, table)
    assert ways, drawn(plan)
    assert not any("Seq Scan" in way or way == "Scan" for way in ways), drawn(plan)
    return ways


async def test_the_overview_reads_through_indexes(db: Database) -> None:
    Session, engine = await filled(db)
    async with connect_workflows(Session) as connection:
        with sent(engine) as seen:
            found = await overview(connection, tables_for(Outbox))
    onboarding = next(w for w in found.workflows if w.workflow == "onboarding")
    assert onboarding.total is None and onboarding.window == 10_000  # more rows than counted
    assert onboarding.states["scheduled"] > 0 and onboarding.states["finished"] > 0
    assert found.outbox is not None and found.outbox.counts["dead_letter"] == EVENTS // 500

    statements = [s for s in plans_of(seen, "FROM onboarding") if "count(" in s[0]]
    # The filled runs were due long ago: the overview also lists the stranded ones by step.
    assert len(statements) == 3 and found.stranded, statements
    live, recent, stranded = statements
    stranded_plan = await plan_of(engine, stranded)
    assert no_seq_scan(stranded_plan, "onboarding") == {"ix_onboarding_due"}, drawn(stranded_plan)
    live_plan = await plan_of(engine, live)
    assert no_seq_scan(live_plan, "onboarding") == {"ix_onboarding_due"}, drawn(live_plan)
    recent_plan = await plan_of(engine, recent)
    assert no_seq_scan(recent_plan, "onboarding") == {"onboarding_pkey"}, drawn(recent_plan)
    [outbox] = [s for s in plans_of(seen, "FROM duly_outbox") if "jsonb_object_agg" in s[0]]
    outbox_plan = await plan_of(engine, outbox)
    assert no_seq_scan(outbox_plan, "duly_outbox") == {"ix_duly_outbox_status"}, drawn(outbox_plan)


async def test_newest_runs_are_read_through_the_primary_key(db: Database) -> None:
    Session, engine = await filled(db)
    info = workflow_info(Onboarding)
    async with connect_workflows(Session) as connection:
        cases = [
            RunFilter(),
            RunFilter(state="failed"),
            RunFilter(step="check", error="no such"),
            RunFilter(state="running"),
        ]
        for filters in cases:
            with sent(engine) as seen:
                page = await list_runs(connection, info, filters)
            assert page.runs or filters.error, filters
            # The page, and for a sparse filter where its search window ends: the key's index.
            for statement in plans_of(seen, "FROM onboarding"):
                plan = await plan_of(engine, statement)
                ways = no_seq_scan(plan, "onboarding")
                assert ways == {"onboarding_pkey"}, (filters, drawn(plan))
        sparse = await list_runs(connection, info, RunFilter(state="running"))
        assert sparse.searching and sparse.next_after is not None  # stopped at its window
        first = await list_runs(connection, info, RunFilter(state="finished"))
        assert first.next_after is not None
        with sent(engine) as seen:
            second = await list_runs(
                connection, info, RunFilter(state="finished"), after=first.next_after
            )
    assert {r.key for r in first.runs}.isdisjoint(r.key for r in second.runs)
    assert int(second.runs[0].key) < int(first.runs[-1].key)
    plan = await plan_of(engine, plans_of(seen, "FROM onboarding")[0])
    assert no_seq_scan(plan, "onboarding") == {"onboarding_pkey"}, drawn(plan)


async def test_soonest_runs_are_read_through_the_due_index(db: Database) -> None:
    Session, engine = await filled(db)
    info = workflow_info(Onboarding)
    async with connect_workflows(Session) as connection:
        with sent(engine) as seen:
            first = await list_runs(connection, info, order="soonest")
        plan = await plan_of(engine, plans_of(seen, "FROM onboarding")[0])
        assert no_seq_scan(plan, "onboarding") == {"ix_onboarding_due"}, drawn(plan)
        with sent(engine) as seen:
            await list_runs(connection, info, RunFilter(state="retrying"), order="soonest")
        for statement in plans_of(seen, "FROM onboarding"):  # the page, and its window's end
            plan = await plan_of(engine, statement)
            assert no_seq_scan(plan, "onboarding") == {"ix_onboarding_due"}, drawn(plan)
        assert first.next_after is not None
        with sent(engine) as seen:
            second = await list_runs(connection, info, order="soonest", after=first.next_after)
        plan = await plan_of(engine, plans_of(seen, "FROM onboarding")[0])
        assert no_seq_scan(plan, "onboarding") == {"ix_onboarding_due"}, drawn(plan)
        due = [run.row["wake_at"] for run in first.runs + second.runs]
        assert due == sorted(due) and len(set(run.key for run in first.runs + second.runs)) == 100
        # Past the scheduled runs, the rest (ended) come by key, through the primary key.
        with sent(engine) as seen:
            ended = await list_runs(connection, info, RunFilter(state="failed"), order="soonest")
        assert ended.runs and all(run.state == "failed" for run in ended.runs)
        plan = await plan_of(engine, plans_of(seen, "FROM onboarding")[0])
        assert no_seq_scan(plan, "onboarding") == {"onboarding_pkey"}, drawn(plan)


async def test_the_activity_and_a_runs_attempts_read_through_indexes(db: Database) -> None:
    Session, engine = await filled(db)
    info = workflow_info(Onboarding)
    async with connect_workflows(Session) as connection:
        with sent(engine) as seen:
            recent = await activity(connection)
        steps, failures = recent.total("onboarding")
        # A third of the attempts (the last of three hours), a fiftieth of them retried.
        assert abs(steps - LOG_ROWS // 3) <= 200 and 0 < failures < steps // 20
        [statement] = plans_of(seen, "date_trunc")
        plan = await plan_of(engine, statement, analyze=True)
        log_scans(plan, filled_partitions(db))
        # Each read of the log (finding where the hour starts, then counting it) stops at the
        # hour's edge: a third of the log, not all of it (its partitions' reads together).
        reads = [
            sum(
                int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
                for node in _nodes(append)
                if of_log(node)
            )
            for append in _nodes(plan)
            if append["Node Type"] == "Merge Append"
        ]
        assert reads and max(reads) <= LOG_ROWS // 3 + 10, (reads, drawn(plan))

        with sent(engine) as seen:
            detail = await run_detail(connection, info, parse_key(info, "40"), attempts=1)
        # Two attempts were logged for run 40: the newest is shown, and the page says so.
        assert detail.history is not None and len(detail.history) == 1 and detail.earlier
        assert detail.history[0]["id"] == ROWS + 39
        [history] = plans_of(seen, "FROM workflow_attempt")
        plan = await plan_of(engine, history)
        # Each day's partition through its part of ix_workflow_attempt_run.
        assert all(
            way.endswith("_workflow_run_key_id_idx")
            for way in log_scans(plan, filled_partitions(db))
        ), drawn(plan)


def of_log(node: Plan, partitions: set[str] | None = None) -> bool:
    """Whether a plan node reads the attempt log: one of its day partitions or the default
    (one of `partitions`, when given)."""
    name = str(node.get("Relation Name", ""))
    return name.startswith("workflow_attempt_") and (partitions is None or name in partitions)


def filled_partitions(db: Database) -> set[str]:
    """The attempt log's partitions that hold rows (an empty one is read by a Seq Scan of
    nothing, which the planner rightly prefers)."""
    return {str(name) for (name,) in db.sql("SELECT DISTINCT tableoid::regclass::text "
                                           "FROM workflow_attempt")}  # fmt: skip


def log_scans(plan: Plan, partitions: set[str]) -> set[str]:
    """How the plan reads the log's `partitions`, checked to be index scans only."""
    found = [n for n in _nodes(plan) if of_log(n, partitions)]
    ways = {str(n.get("Index Name", n["Node Type"])) for n in found}
    assert ways and not any("Seq Scan" in way or way == "Scan" for way in ways), drawn(plan)
    return ways


def _nodes(plan: Plan) -> list[Plan]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found
