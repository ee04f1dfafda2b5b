"""What each console page costs with 100,000 runs in a table: p50 and p95 over many fetches.

A fresh database with the example app's tables, filled as a deployment that has run for a
while looks (runs mostly ended, some scheduled, waiting or retrying; two attempts a run; an
outbox nearly all processed, some dead letters), then `VACUUM ANALYZE`. The deployable app
(`create_app`, no worker) is served in-process through httpx's ASGI transport, so the figure
is the app's own time; each page is fetched `fetches` times after 5 warm-ups, and must
answer 200.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
from psycopg import sql
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from bench import measures
from engine.graphs.configure import forget_graph_runtime
from functions import examples
from functions.app import create_app
from functions.local.dev import install_example_graph
from infra.app_config import configure_app_graphs
from infra.embedded import EmbeddedPostgres

WARMUP_FETCHES = 5  # left out: the first fetches plan statements and fill caches
TARGET_MS = 200.0  # the aim: every page within 200 ms, p95
DATABASE = "bench_console"
GRAPH_INSTANCES = 2000  # expense claims submitted to the example graph


async def measure_console(server: EmbeddedPostgres, runs: int, fetches: int) -> dict[str, Any]:
    """Every console page's fetch times over a table of `runs` runs."""
    async with console_database(server) as Session:
        began = time.perf_counter()
        await fill(server, runs)
        fill_seconds = time.perf_counter() - began
        configure_app_graphs(examples.__name__)
        app = create_app(Session, run_worker=False)
        try:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://bench"
                ) as client:
                    began = time.perf_counter()
                    graph_pages = await submit_instances(server, client, GRAPH_INSTANCES)
                    fill_seconds += time.perf_counter() - began
                    pages = {**await page_urls(client, runs), **graph_pages}
                    found: dict[str, Any] = {}
                    for name, url in pages.items():
                        timings = await fetch_times(client, url, fetches)
                        found[name] = {"url": url, "ms": measures.percentiles(timings)}
        finally:
            forget_graph_runtime()
    return {
        "runs": runs,
        "graph_instances": GRAPH_INSTANCES,
        "fetches": fetches,
        "fill_s": fill_seconds,
        "pages": found,
    }


async def submit_instances(
    server: EmbeddedPostgres, client: httpx.AsyncClient, instances: int
) -> dict[str, str]:
    """The example graph saved and active, `instances` expense claims submitted to it (each
    through `POST /graphs/instances`), one moved a step; the graph pages that show them."""
    await install_example_graph()
    async with await psycopg.AsyncConnection.connect(
        server.conninfo_for(DATABASE), autocommit=True
    ) as conn:
        await conn.execute(
            "INSERT INTO expense_claims (title, amount, submitted_by) "
            "SELECT 'Trip ' || i, 100 + i %% 5000, 'sam' FROM generate_series(1, %s) AS i",
            (instances,),
        )
    workflow = examples.expense_graph.EXPENSE_APPROVAL
    instance_id = ""
    for claim in range(1, instances + 1):
        reply = await client.post(
            "/graphs/instances",
            json={
                "subject_type": "expense_claims",
                "subject_key": str(claim),
                "user": "sam",
                "workflow": workflow,
            },
        )
        if reply.status_code != 201:
            raise RuntimeError(f"submitting claim {claim}: {reply.status_code} {reply.text[:300]}")
        instance_id = reply.json()["id"]
    template_id = reply.json()["template_id"]
    return {
        "graphs": "/console/graphs",
        "a graph template": f"/console/graphs/templates/{template_id}",
        "a graph instance": f"/console/graphs/instances/{instance_id}?user=mia",
        "the designer": "/console/graphs/designer",
        "the designer, a copy": f"/console/graphs/designer/{template_id}",
    }


@asynccontextmanager
async def console_database(
    server: EmbeddedPostgres,
) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """A fresh database with the example app's tables; its session factory."""
    admin = server.conninfo_for("postgres")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        name = sql.Identifier(DATABASE)
        await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    engine = create_async_engine(server.url_for(DATABASE))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(examples.Base.metadata.create_all)
        yield async_sessionmaker(engine, expire_on_commit=False)
    finally:
        await engine.dispose()


async def fill(server: EmbeddedPostgres, runs: int) -> None:
    """The runs, their attempts and an outbox, as a deployment in service has them."""
    statements = [
        # One run in 20 has a step scheduled (over the next four days, a few leased, a
        # fifth of them retrying), one in 25 waits for an event; the rest ended: one in 50
        # failed, one in 70 cancelled.
        f"""
        INSERT INTO onboarding (user_id, email, nudges, status, next_step, next_args, wake_at,
                                claimed_until, waiting_for, attempts, last_error)
        SELECT 'u' || i, 'u' || i || '@example.com', i % 3, 'bench',
            CASE WHEN scheduled THEN 'check' END,
            CASE WHEN scheduled THEN '{{"args": [], "kwargs": {{}}}}'::jsonb END,
            CASE WHEN scheduled THEN now() + (i % 5760) * interval '1 minute' END,
            CASE WHEN scheduled AND i % 97 = 0 THEN now() + interval '5 minutes' END,
            CASE WHEN waiting THEN 'activated' END,
            CASE WHEN scheduled AND i % 5 = 0 THEN 2 ELSE 0 END,
            CASE WHEN scheduled AND i % 5 = 0 THEN 'TimeoutError: the provider timed out'
                 WHEN NOT scheduled AND NOT waiting AND i % 50 = 1 THEN 'ValueError: no user'
                 WHEN NOT scheduled AND NOT waiting AND i % 70 = 3 THEN 'cancelled' END
        FROM (SELECT i, i % 20 = 0 AS scheduled, i % 25 = 7 AS waiting
              FROM generate_series(1, {runs}) AS i) AS runs
        """,
        # Two attempts a run, in key order over the last ten hours (the newest hour: a tenth).
        f"""
        INSERT INTO workflow_attempt (workflow, run_key, step, attempt, outcome, error,
                                      took_ms, finished_at)
        SELECT 'onboarding', (i % {runs} + 1)::text, CASE WHEN i <= {runs} THEN 'welcome'
                                                         ELSE 'check' END, 1,
            CASE WHEN i % 40 = 0 THEN 'retry' ELSE 'ok' END,
            CASE WHEN i % 40 = 0 THEN 'TimeoutError: the provider timed out' END,
            (i % 17) * 0.7 + 0.2,
            now() - interval '10 hours' + i * (interval '10 hours' / {2 * runs})
        FROM generate_series(1, {2 * runs}) AS i
        """,
        # Events: one in 200 dead-lettered (its delivery row says why), one in 301 pending.
        f"""
        INSERT INTO duly_events (event_id, event_type, event_name, payload, metadata,
                                 occurred_at, created_at)
        SELECT 'e' || i, 'expense.submitted', 'expense_submitted',
            jsonb_build_object('expense_id', i, 'amount', i % 900), '{{}}'::jsonb,
            now() - interval '1 day' + i * interval '1 second',
            now() - interval '1 day' + i * interval '1 second'
        FROM generate_series(1, {runs // 5}) AS i
        """,
        f"""
        INSERT INTO duly_outbox (event_id, event_type, event_name, status, route_attempts, error,
                                 created_at, settled_at, next_step, next_args, wake_at)
        SELECT 'e' || i, 'expense.submitted', 'expense_submitted',
            CASE WHEN i % 200 = 0 THEN 'dead_letter' WHEN i % 301 = 0 THEN 'pending'
                 ELSE 'processed' END,
            CASE WHEN i % 200 = 0 THEN 3 ELSE 1 END,
            CASE WHEN i % 200 = 0 THEN 'ConnectionError: the mail server refused' END,
            now() - interval '1 day' + i * interval '1 second',
            CASE WHEN i % 301 <> 0 THEN now() - interval '1 day' + i * interval '1 second' END,
            CASE WHEN i % 301 = 0 THEN 'route' END,
            CASE WHEN i % 301 = 0 THEN '{{"args": [], "kwargs": {{}}}}'::jsonb END,
            CASE WHEN i % 301 = 0 THEN now() END
        FROM generate_series(1, {runs // 5}) AS i
        """,
        f"""
        INSERT INTO duly_deliveries (event_id, route, event_key, handler, status, attempts,
                                     error, updated_at)
        SELECT 'e' || i, 'r1', 'expense.submitted', 'functions.examples.start_expense',
            CASE WHEN i % 200 = 0 THEN 'dead_letter' ELSE 'succeeded' END,
            CASE WHEN i % 200 = 0 THEN 3 ELSE 1 END,
            CASE WHEN i % 200 = 0 THEN 'ConnectionError: the mail server refused' END,
            now() - interval '1 day' + i * interval '1 second'
        FROM generate_series(1, {runs // 5}) AS i
        """,
    ]
    async with await psycopg.AsyncConnection.connect(
        server.conninfo_for(DATABASE), autocommit=True
    ) as conn:
        for statement in statements:
            await conn.execute(statement)
        await conn.execute("VACUUM ANALYZE")


async def page_urls(client: httpx.AsyncClient, runs: int) -> dict[str, str]:
    """Every page the console serves, with the cursors and keys it links to."""
    deep = await client.get("/workflows/onboarding/runs", params={"limit": 50, "offset": 0})
    cursor = deep.json()["next_after"]
    busy = 20 * (runs // 40)  # a scheduled run with two attempts
    return {
        "overview": "/console",
        "overview (live part)": "/console/overview/live",
        "runs, newest": "/console/runs/onboarding",
        "runs, newest, page 2": f"/console/runs/onboarding?after={cursor}",
        "runs, soonest": "/console/runs/onboarding?order=soonest",
        "runs, state=failed": "/console/runs/onboarding?state=failed",
        "runs, state=running (sparse)": "/console/runs/onboarding?state=running",
        "runs, error text": "/console/runs/onboarding?error=provider",
        "runs, soonest, retrying": "/console/runs/onboarding?order=soonest&state=retrying",
        "a run": f"/console/runs/onboarding/{busy}",
        "a run (live part)": f"/console/runs/onboarding/{busy}/live",
        "start form": "/console/runs/onboarding/start",
        "run-a-step form": f"/console/runs/onboarding/{busy}/run?step=check",
        "outbox": "/console/outbox",
        "outbox, dead letters": "/console/outbox?status=dead_letter",
        "an event": "/console/outbox/events/e200",
        "login": "/console/login",
    }


async def fetch_times(client: httpx.AsyncClient, url: str, fetches: int) -> list[float]:
    """`fetches` timed GETs of `url` (ms), after the warm-up ones; each must answer 200."""
    timings: list[float] = []
    for n in range(WARMUP_FETCHES + fetches):
        began = time.perf_counter()
        reply = await client.get(url)
        took = (time.perf_counter() - began) * 1000
        if reply.status_code != 200:
            raise RuntimeError(f"{url} answered {reply.status_code}: {reply.text[:300]}")
        if n >= WARMUP_FETCHES:
            timings.append(took)
    return timings
