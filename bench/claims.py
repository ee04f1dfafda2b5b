"""What one claim costs against the backlog behind it, with a limit and without.

The claim is called directly (no worker process): the figure is the claim's
own statements and round trips, from the bench process, on a table of
`rows` due runs spread over `groups` tenants. After each timed claim the
rows it took are finished, untimed, so the backlog stays the same size and
no tenant stays at its limit. A limited claim keeps a `GroupMemory` across
the claims, as a worker does; the case says how many claims visited every
group.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from psycopg import sql
from sqlalchemy import Table, update

from bench.harness import BenchDatabase
from bench.models import Backlog, LimitedBacklog
from engine.claims.claim import claim_due
from engine.claims.group_memory import GroupMemory
from engine.claims.limited import claim_limited
from engine.model.registry import workflow_info
from infra.embedded import EmbeddedPostgres

CLAIM_SIZE = 8  # rows a claim asks for: an empty pass of a worker with max_concurrency 8
LEASE = timedelta(minutes=5)
WARMUP_CLAIMS = 10  # left out: the first statements plan and fill caches


async def measure_claim_cost(
    server: EmbeddedPostgres,
    limited: bool,
    rows: int,
    groups: int,
    claims: int,
    big_first: int = 0,
) -> dict[str, Any]:
    """Time `claims` claims of CLAIM_SIZE rows from a backlog of `rows` due runs.

    `big_first` of them, the oldest, belong to one more tenant: an import ahead
    of everyone, the case where a limited claim must visit every tenant.
    """
    model = LimitedBacklog if limited else Backlog
    info = workflow_info(model)
    table = info.table
    name = f"bench_claims_{int(limited)}_{rows}_{groups}_{big_first}"
    async with BenchDatabase(server, name) as db:
        fill_seconds = await _fill(db, table, rows, groups, big_first)
        autocommit = db.engine.execution_options(isolation_level="AUTOCOMMIT")
        timings: list[float] = []
        memory = GroupMemory()
        visits_before_timing = 0
        async with autocommit.connect() as lookup, db.engine.connect() as claiming:
            for i in range(WARMUP_CLAIMS + claims):
                if i == WARMUP_CLAIMS:
                    visits_before_timing = memory.visits
                began = time.perf_counter()
                if limited:
                    taken = await claim_limited(
                        claiming, info, CLAIM_SIZE, LEASE, None, None, memory
                    )
                else:
                    taken = list(await claim_due(lookup, info, CLAIM_SIZE, LEASE))
                took = (time.perf_counter() - began) * 1000
                if len(taken) != CLAIM_SIZE:
                    raise RuntimeError(f"a claim took {len(taken)} rows, not {CLAIM_SIZE}")
                if i >= WARMUP_CLAIMS:
                    timings.append(took)
                done = [row.id for row in taken]
                await lookup.execute(
                    update(table)
                    .where(table.c.id.in_(done))
                    .values(next_step=None, claimed_until=None, wake_at=None)
                )
    return {
        "rows": rows,
        "groups": groups,
        "big_first": big_first,
        "claims": claims,
        "fill_s": fill_seconds,
        "visits_of_every_group": memory.visits - visits_before_timing,  # of the timed claims
        "ms": timings,
    }


async def _fill(
    db: BenchDatabase, table: Table, rows: int, groups: int, big_first: int = 0
) -> float:
    """`rows` due runs, oldest first, round-robin over `groups` tenants; then ANALYZE.

    The oldest `big_first` rows go to tenant -1 instead.
    """
    began = time.perf_counter()
    name = sql.Identifier(table.name)
    await db.scalar(
        sql.SQL(
            "INSERT INTO {} (tenant, next_step, next_args, wake_at) "
            "SELECT CASE WHEN g <= %s THEN -1 ELSE g %% %s END, 'run', "
            '\'{{"args": [], "kwargs": {{}}}}\'::jsonb, '
            "now() - make_interval(secs => (%s - g) / 1000.0) "
            "FROM generate_series(1, %s) AS g"
        ).format(name),
        big_first,
        groups,
        rows,
        rows,
    )
    await db.scalar(sql.SQL("ANALYZE {}").format(name))
    return time.perf_counter() - began
