"""The event layer's figures: events the outbox routes a second, and what publishing adds.

The outbox is a workflow table of the engine's own: a worker serving it
claims its rows and runs their `route` step, which routes the event with the
registry configured in the worker's process (`bench.worker_process --events`:
one no-op handler). Publishing is one statement in the caller's transaction,
so its cost is what it adds to that transaction. bench/README.md says how
each figure is taken.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from psycopg import sql
from sqlalchemy import event, insert
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.harness import (
    BenchDatabase,
    WorkerProcess,
    check_no_failures,
    cpu_since,
    server_cpu,
    wait_until_done,
)
from bench.measures import percentiles
from bench.models import OUTBOX_WORKFLOW, BenchOrder, BenchOutbox, bench_event
from engine import DatabaseEventRegistry, EventSettings
from infra.embedded import EmbeddedPostgres

OUTBOX_TABLE = "bench_outbox"
EVENT_TABLES = ("bench_events", "bench_outbox", "bench_deliveries")
PUBLISH_BATCH = 100  # events per publish_many, each in a transaction of its own
PUBLISH_BATCHES = (0, 1, 100)  # events published in each kind of timed transaction
PUBLISH_WARMUP = 50  # transactions of each kind left out of the publish cost


def bench_registry() -> DatabaseEventRegistry:
    """A registry writing the bench's outbox, as production configures it (async delivery)."""
    return DatabaseEventRegistry(
        outbox=BenchOutbox, settings=EventSettings(mode="production", async_delivery=True)
    )


async def publish_events(db: BenchDatabase, events: int) -> float:
    """Publish `events`, PUBLISH_BATCH per publish_many in a transaction each; seconds taken."""
    registry = bench_registry()
    Session = db.sessionmaker()
    began = time.perf_counter()
    for first in range(0, events, PUBLISH_BATCH):
        batch = [bench_event(i) for i in range(first, min(events, first + PUBLISH_BATCH))]
        async with Session() as session, session.begin():
            stored = await registry.publish_many(batch, session=session)
        if len(stored) != len(batch):
            raise RuntimeError(f"publish_many stored {len(stored)} of {len(batch)} new events.")
    seconds = time.perf_counter() - began
    for table in EVENT_TABLES:
        await db.scalar(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    return seconds


async def measure_outbox(
    server: EmbeddedPostgres,
    events: int,
    concurrency: int,
    pool_size: int | None,
    diagnostics: Path | None = None,
    profile: bool = False,
) -> dict[str, Any]:
    """Publish `events` (all due now), start one outbox worker, time it until none is pending.

    Every row must end processed, with exactly one succeeded delivery (and
    no other) per event. With `diagnostics` (a directory), the worker writes
    its statements by kind there (outbox_<concurrency>.statements.json) and,
    with `profile`, runs under cProfile (outbox_<concurrency>.prof).
    """
    async with BenchDatabase(server, f"bench_outbox_{concurrency}") as db:
        publish_seconds = await publish_events(db, events)
        options = ["--events"]
        if diagnostics is not None:
            stem = diagnostics / f"outbox_{concurrency}"
            options += ["--statement-log", f"{stem}.statements.json"]
            if profile:
                options += ["--profile", f"{stem}.prof"]
        async with WorkerProcess(db, [OUTBOX_WORKFLOW], pool_size, concurrency, options) as worker:
            before, worker_before = server_cpu(server), worker.cpu_now()
            done_at = await wait_until_done(db, OUTBOX_TABLE, worker)
            server_seconds = cpu_since(server, before)
            worker_seconds = worker.cpu_now() - worker_before
            await worker.stop()  # for its counts
        await check_no_failures(db, OUTBOX_TABLE)
        unprocessed = await db.scalar(
            "SELECT count(*) FROM bench_outbox WHERE status <> 'processed' OR error IS NOT NULL"
        )
        deliveries = await db.scalar("SELECT count(*) FROM bench_deliveries")
        delivered = await db.scalar(
            "SELECT count(*) FROM bench_outbox o WHERE (SELECT count(*) FROM bench_deliveries d "
            "WHERE d.event_id = o.event_id AND d.status = 'succeeded' AND d.attempts = 1) = 1"
        )
    if unprocessed:
        raise RuntimeError(f"{unprocessed} of {events} outbox rows did not end processed.")
    if delivered != events or deliveries != events:
        raise RuntimeError(
            f"{delivered} of {events} events have exactly one succeeded delivery, "
            f"of {deliveries} delivery rows in all."
        )
    seconds = done_at - worker.ready_at
    statements = worker.statements
    return {
        "events": events,
        "max_concurrency": concurrency,
        "seconds": seconds,
        "events_per_s": events / seconds,
        "publish_seconds": publish_seconds,  # before the clock, PUBLISH_BATCH at a time
        "passes": worker.passes,
        "worker_cpu_seconds": worker.cpu_seconds,
        # As the no-op line's: from the bench seeing "ready" until none was pending.
        "worker_cpu_in_window_seconds": worker_seconds,
        "server_cpu_seconds": server_seconds,
        "worker_connections_opened": worker.connections,
        # Every statement its engine sent, start-up included (the listener's LISTEN aside).
        "worker_statements": statements,
        "worker_statements_per_event": None if statements is None else statements / events,
        "diagnostics": None if diagnostics is None else str(diagnostics),
    }


async def measure_publish_cost(
    server: EmbeddedPostgres, transactions: int, warmup: int = PUBLISH_WARMUP
) -> dict[str, Any]:
    """Time transactions of one business INSERT, without publishing and with 1 and 100 events.

    Each kind runs `warmup` + `transactions` times, the kinds taking turns
    (in a rotating order, so none always follows the same one), each from
    BEGIN to COMMIT on a pool of one connection. The events are built before
    the clock starts. A `before_cursor_execute` listener counts every
    statement each publish_many sends: one statement for a batch, or the
    figure is refused.
    """
    async with BenchDatabase(server, "bench_publish") as db:
        engine = create_async_engine(db.url, pool_size=1, max_overflow=0)
        sent = [0]

        def count(*_: object) -> None:
            sent[0] += 1

        event.listen(engine.sync_engine, "before_cursor_execute", count)
        Session = async_sessionmaker(engine, expire_on_commit=False)
        registry = bench_registry()
        ms: dict[int, list[float]] = {size: [] for size in PUBLISH_BATCHES}
        per_publish: dict[int, set[int]] = {size: set() for size in PUBLISH_BATCHES if size}
        serial = 0
        try:
            for i in range(warmup + transactions):
                turn = i % len(PUBLISH_BATCHES)
                for size in PUBLISH_BATCHES[turn:] + PUBLISH_BATCHES[:turn]:
                    batch = [bench_event(serial + j) for j in range(size)]
                    serial += size
                    began = time.perf_counter()
                    async with Session() as session, session.begin():
                        await session.execute(insert(BenchOrder).values(note=f"order {i}"))
                        if batch:
                            before = sent[0]
                            await registry.publish_many(batch, session=session)
                            per_publish[size].add(sent[0] - before)
                    if i >= warmup:
                        ms[size].append((time.perf_counter() - began) * 1000)
        finally:
            await engine.dispose()
        stored = await db.scalar("SELECT count(*) FROM bench_outbox")
    expected = (warmup + transactions) * sum(PUBLISH_BATCHES)
    if stored != expected:
        raise RuntimeError(f"{stored} outbox rows stored, {expected} expected.")
    if any(counts != {1} for counts in per_publish.values()):
        seen = {size: sorted(counts) for size, counts in per_publish.items()}
        raise RuntimeError(f"publish_many sent {seen} statements a call (by batch size), not 1.")
    cut = {size: percentiles(values) for size, values in ms.items()}
    plain = cut[0]
    found: dict[str, Any] = {
        "transactions": transactions,
        "warmup": warmup,
        "statements_per_publish": {str(s): sorted(c)[0] for s, c in per_publish.items()},
        "business_insert_only_ms": plain,
    }
    for size in PUBLISH_BATCHES[1:]:
        label = f"{size}_event{'s' if size > 1 else ''}"
        found[f"with_{label}_ms"] = cut[size]
        # The difference of the percentiles, not a percentile of differences.
        found[f"added_by_{label}_ms"] = {p: cut[size][p] - plain[p] for p in ("p50", "p95", "p99")}
    return found
