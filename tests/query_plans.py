"""The plans of the statements the engine sends, read with `EXPLAIN (FORMAT JSON)`.

`fill_runs` fills a workflow table with many runs in every state, `sent` catches
the statements an engine sends, `plan_of` explains one as sent, and `reached_by`
says which indexes (or which other scans) the plan reads a table through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from infra.testing.pytest_plugin import Database

ROWS = 20_000  # runs `fill_runs` writes
GROUPS = 200  # rows in a round of `fill_runs`

Sent = list[tuple[str, Any]]
Plan = dict[str, Any]


def fill_runs(db: Database, table: str, columns: dict[str, str], step: str) -> None:
    """ROWS runs of `table` (`i` from 1) in rounds of GROUPS, `wake_at` rising with `i`.

    `columns` are the table's own columns and `step` the step a run has
    scheduled, as SQL of `i`. A round in ten is finished and a round in ten
    sleeps until later; a row in 97 of the others is leased; the rest are due.
    """
    db.sql(
        f"""
        INSERT INTO {table} ({", ".join(columns)}, next_step, next_args, wake_at, claimed_until)
        SELECT {", ".join(columns.values())},
            CASE WHEN NOT finished THEN {step} END,
            CASE WHEN NOT finished THEN '{{}}'::json END,
            CASE WHEN finished THEN NULL
                WHEN leased THEN now() + interval '5 minutes'
                WHEN later THEN now() + i * interval '1 second'
                ELSE now() - interval '1 day' + i * interval '1 second' END,
            CASE WHEN leased THEN now() + interval '5 minutes' END
        FROM (
            SELECT i, (i / {GROUPS}) % 10 = 0 AS finished, (i / {GROUPS}) % 10 = 1 AS later,
                (i / {GROUPS}) % 10 > 1 AND i % 97 = 0 AS leased
            FROM generate_series(1, {ROWS}) AS i
        ) AS runs
        """
    )


def analyzed(db: Database, Session: Any, *tables: str) -> AsyncEngine:
    """ANALYZE `tables`; the engine the session factory binds."""
    db.sql(f"ANALYZE {', '.join(tables)}")
    engine: AsyncEngine = Session.kw["bind"]
    return engine


@contextmanager
def sent(engine: AsyncEngine) -> Iterator[Sent]:
    """The statements, with their parameters, `engine` sends while the block runs."""
    seen: Sent = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", capture)


def the_one(seen: Sent, marker: str) -> tuple[str, Any]:
    """The one statement sent that contains `marker`."""
    found = [(statement, parameters) for statement, parameters in seen if marker in statement]
    assert len(found) == 1, [statement for statement, _ in seen]
    return found[0]


async def plan_of(
    engine: AsyncEngine, sent: tuple[str, Any], analyze: bool = False, buffers: bool = False
) -> Plan:
    """The plan of a statement as sent; run (ANALYZE, with BUFFERS if asked) only when asked,
    and rolled back."""
    statement, parameters = sent
    options = "FORMAT JSON"
    if analyze:
        options = f"ANALYZE, {'BUFFERS, ' if buffers else ''}{options}"
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql(f"EXPLAIN ({options}) {statement}", parameters)
        plan: Plan = result.scalar_one()[0]["Plan"]
        await conn.rollback()
    return plan


def nodes(plan: Plan) -> Iterator[Plan]:
    """Every node of a plan, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def reached_by(plan: Plan, table: str) -> set[str]:
    """How a plan reads `table`: the indexes its scans use, or any other scan's node type.

    A Bitmap Heap Scan counts as the indexes of its Bitmap Index Scans.
    """
    ways: set[str] = set()
    for node in nodes(plan):
        if node.get("Relation Name") != table or node["Node Type"] == "ModifyTable":
            continue
        if node["Node Type"] == "Bitmap Heap Scan":
            ways |= {n["Index Name"] for n in nodes(node) if n["Node Type"] == "Bitmap Index Scan"}
        else:
            ways.add(str(node.get("Index Name", node["Node Type"])))
    return ways


def drawn(plan: Plan, depth: int = 0) -> str:
    """The plan's nodes, one a line: an assertion's message."""
    keys = ("Node Type", "Relation Name", "Alias", "Index Name", "Filter")
    line = "  " * depth + " ".join(str(plan[key]) for key in keys if key in plan)
    return "\n".join([line, *(drawn(child, depth + 1) for child in plan.get("Plans", []))])
