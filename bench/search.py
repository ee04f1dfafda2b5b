"""What the first page of a search costs over a million runs: p50 and p95 for each kind of filter.

A fresh database, `bench_payment` filled by one INSERT ... SELECT (one run each 3 s up to now,
amounts spread over 0 to 1,000; a run in 20 scheduled, a run in 50 failed, one in 5,000
declined), then `VACUUM ANALYZE`. Each filter's text is read by `parse_filter` and its first
page by `list_runs`, the query the API, `duly runs` and the console share; each is timed
`fetches` times after the warm-ups, and must find a run.
"""

from __future__ import annotations

import time
from typing import Any

from bench import measures
from bench.harness import BenchDatabase
from bench.models import BenchPayment
from engine import connect_workflows
from engine.model.registry import workflow_info
from engine.views.filters import parse_filter
from engine.views.runs import list_runs
from infra.embedded import EmbeddedPostgres

TARGET_MS = 50.0  # the aim: a search's first page within 50 ms, p95
WARMUP_FETCHES = 5  # left out: the first fetches plan statements and fill caches
DATABASE = "bench_search"
SEARCHES = {  # what an operator types, by the kind of filter it is
    "no filter": "",
    "state": "state:failed",
    "step": "step:refund",
    "error text": 'error:"card declined"',
    "own column, a range": "amount>=990",
    "own column, one value": "amount=123.45",
    "own column and step": "step:charge amount<10",
    "time range": "created_at>=-1h",
    "failed in the last hour": "state:failed since:1h",
}


async def measure_search(server: EmbeddedPostgres, runs: int, fetches: int) -> dict[str, Any]:
    """Each search's first-page times over a table of `runs` runs."""
    async with BenchDatabase(server, DATABASE) as db:
        began = time.perf_counter()
        await fill(db, runs)
        fill_seconds = time.perf_counter() - began
        info = workflow_info(BenchPayment)
        found: dict[str, Any] = {}
        async with connect_workflows(db.sessionmaker(), workflows=[BenchPayment]) as connection:
            for name, text in SEARCHES.items():
                filters = parse_filter(info, text)
                timings: list[float] = []
                for fetch in range(WARMUP_FETCHES + fetches):
                    began = time.perf_counter()
                    page = await list_runs(connection, info, filters)
                    took = (time.perf_counter() - began) * 1000
                    if not page.runs:
                        raise RuntimeError(f"the search {text!r} found no run")
                    if fetch >= WARMUP_FETCHES:
                        timings.append(took)
                found[name] = {
                    "filter": text,
                    "runs_shown": len(page.runs),
                    "searching": page.searching,
                    "ms": measures.percentiles(timings),
                }
    return {"runs": runs, "fetches": fetches, "fill_s": fill_seconds, "searches": found}


async def fill(db: BenchDatabase, runs: int) -> None:
    """The runs, as a deployment in service has them; then VACUUM ANALYZE."""
    await db.scalar(
        f"""
        INSERT INTO bench_payment (id, amount, created_at, next_step, next_args, wake_at,
                                   attempts, last_error)
        SELECT i, (i::bigint * 7919 % 100000) / 100.0, now() - ({runs} - i) * interval '3 seconds',
            CASE WHEN i % 20 = 0 THEN CASE WHEN i % 3 = 0 THEN 'refund' ELSE 'charge' END END,
            CASE WHEN i % 20 = 0 THEN '{{}}'::jsonb END,
            CASE WHEN i % 20 = 0 THEN now() + (i % 5760) * interval '1 minute' END,
            CASE WHEN i % 50 = 1 THEN 3 ELSE 0 END,
            CASE WHEN i % 5000 = 1 THEN 'CardError: card declined'
                 WHEN i % 50 = 1 THEN 'TimeoutError: the bank timed out' END
        FROM generate_series(1, {runs}) AS i
        """
    )
    await db.scalar("VACUUM ANALYZE bench_payment")
