"""Graph workflows' figures: transitions/s from 8 concurrent clients, and one transition's latency.

Beside them, the same run's plain single-row UPDATE transactions/s at 8
clients on the same database, from the same client processes through the
same SQLAlchemy engine (BEGIN, UPDATE, COMMIT): a transition is one
transaction (lock the instance and branch, vote, move, write the history,
sync the subject, publish the notification to the outbox), so the figure
to read is the ratio. The raw psycopg autocommit UPDATE rate (one round
trip, no transaction block) is reported too, as the ceiling.

The clients move instances of a ping-pong graph (two states, each leading
to the other, one assignee, a single vote) in processes of their own
(`bench.graph_clients`), so the clients' Python is spread as a web tier's
would be. Every transition must move its branch; afterwards the visits are
counted: one per transition, or the figure is refused.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from sqlalchemy import func, insert, select

from bench.graph_clients import USER
from bench.harness import BenchDatabase
from bench.measures import COUNTER_TABLE, measure_updates, percentiles
from bench.models import Base, BenchTicket
from engine import GraphRuntime, activate_template, graph_tables, save_design
from infra.embedded import EmbeddedPostgres

CLIENTS = 8
PROCESSES = 2  # client processes (the machine's cores)
INSTANCES_PER_CLIENT = 64  # each moved a handful of times a run, as approvals are

PING_PONG = {
    "name": "bench-ping-pong",
    "stateChoices": ["ping", "pong"],
    "nodes": [
        {"id": "start", "type": "start", "name": "Start", "x": 0, "y": 0},
        {
            "id": "ping",
            "type": "state",
            "name": "Ping",
            "x": 0,
            "y": 100,
            "stateCode": "ping",
            "assigneeUserIds": [USER],
        },
        {
            "id": "pong",
            "type": "state",
            "name": "Pong",
            "x": 0,
            "y": 200,
            "stateCode": "pong",
            "assigneeUserIds": [USER],
        },
        {"id": "done", "type": "end", "name": "Done", "x": 0, "y": 300},
    ],
    "connections": [
        {"source": "start", "target": "ping"},
        {"source": "ping", "target": "pong"},
        {"source": "pong", "target": "ping"},
        {"source": "pong", "target": "done"},
    ],
}


async def prepare(db: BenchDatabase, instances: int) -> list[list[str]]:
    """Activate the ping-pong graph and submit `instances` tickets; each one's move, as text."""
    tables = graph_tables(Base)
    runtime = GraphRuntime(tables, engine=db.engine)
    async with db.engine.begin() as conn:
        saved = await save_design(conn, tables, PING_PONG, ())
        if saved.errors:
            raise RuntimeError(f"the bench graph is invalid: {saved.errors}")
        graph = await activate_template(conn, tables, saved.template_id, ())
        await conn.execute(insert(BenchTicket), [{"id": i} for i in range(1, instances + 1)])
    ping, pong = graph.by_key("ping"), graph.by_key("pong")
    assert ping is not None and pong is not None
    moves = []
    Session = db.sessionmaker()
    async with Session() as session:
        tickets = (await session.scalars(select(BenchTicket).order_by(BenchTicket.id))).all()
    for ticket in tickets:
        instance = await runtime.submit(ticket, USER, template_name=PING_PONG["name"])
        [branch] = instance.branches
        moves.append([str(instance.id), str(branch.id), str(pong.id), str(ping.id)])
    return moves


async def run_clients(
    db: BenchDatabase, work: list[Any], seconds: float, *, updates: bool = False
) -> list[Any]:
    """Start the client processes, let them go together, and collect what each reports."""
    processes = []
    for p in range(PROCESSES):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.graph_clients",
            db.url,
            "--clients",
            str(CLIENTS // PROCESSES),
            "--seconds",
            str(seconds),
            *(["--updates"] if updates else []),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write((json.dumps(work[p::PROCESSES]) + "\n").encode())
        await process.stdin.drain()
        processes.append(process)
    for process in processes:
        assert process.stdout is not None
        line = await process.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"a graph client process did not start: {line!r}")
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        await process.stdin.drain()
    reports = []
    for process in processes:
        out, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"a graph client process failed (exit {process.returncode})")
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    return reports


async def measure_transitions(server: EmbeddedPostgres, seconds: float) -> dict[str, Any]:
    """Plain UPDATEs at 8 clients, then transitions from 8 clients, on one fresh database."""
    async with BenchDatabase(server, "bench_graphs") as db:
        await db.scalar(COUNTER_TABLE)
        raw_updates = await measure_updates(db, CLIENTS, seconds)
        plain = await run_clients(db, list(range(1, CLIENTS + 1)), seconds, updates=True)
        updates = sum(r["transactions"] for r in plain) / max(r["seconds"] for r in plain)
        moves = await prepare(db, CLIENTS * INSTANCES_PER_CLIENT)
        await db.scalar("ANALYZE")  # as a live database's statistics would be
        reports = await run_clients(db, moves, seconds)
        transitions = sum(r["transactions"] for r in reports)
        elapsed = max(r["seconds"] for r in reports)
        visits_table = graph_tables(Base).table("visit")
        async with db.engine.connect() as conn:
            visits = await conn.scalar(select(func.count()).select_from(visits_table))
    if visits != len(moves) + transitions:
        raise RuntimeError(f"{visits} visits for {len(moves)} submits and {transitions} moves.")
    latencies = [ms for r in reports for ms in r["latencies_ms"]]
    rate = transitions / elapsed
    return {
        "clients": CLIENTS,
        "client_processes": PROCESSES,
        "instances": len(moves),
        "seconds": elapsed,
        "transitions": transitions,
        "transitions_per_s": rate,
        "latency_ms": percentiles(latencies),
        # Plain UPDATE transactions from the same clients and engine: what the ratio is of.
        "update_transactions_per_s_8_clients": updates,
        "update_latency_ms": percentiles([ms for r in plain for ms in r["latencies_ms"]]),
        "ratio_to_updates": rate / updates if updates else None,
        # The ceiling: psycopg autocommit UPDATEs, one round trip each, from the bench process.
        "raw_autocommit_updates_per_s_8_clients": raw_updates,
    }
