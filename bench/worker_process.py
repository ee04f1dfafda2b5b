"""One benchmark worker process: serves the named workflows until told to stop.

The bench measures a worker in a process of its own, as it runs in production,
so the bench's own polling and starting never share its event loop. It speaks
on stdout, one line each: `ready <time.time()>` once its `run_workflows` block
is entered, `listening <time.time()>` once its LISTEN connection is up, and
`passes <n>`, `cpu <seconds>` (its own CPU time), `connections <n>` (what its
SQLAlchemy pool opened, the listener's aside) and `statements <n>` (what its
SQLAlchemy engine sent) on its way out. It stops on SIGTERM, SIGINT, or its
stdin closing: the last so a bench that dies without cleaning up does not
leave it running.

    python -m bench.worker_process URL NoOp [--concurrency 8]
    python -m bench.worker_process URL BenchOutbox --events [--statement-log PATH] [--profile PATH]

`--events` configures this process's event registry, which the outbox's
`route` step routes with: a `DatabaseEventRegistry` in production mode with
one no-op handler for the bench's event type. `--statement-log PATH` writes
the statements its engine sent, by kind, with their size and time, to PATH
(JSON); `--profile PATH` runs the worker under cProfile and writes its stats
to PATH: where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.models import BENCH_EVENT_TYPE, WORKFLOWS, ignore_event
from engine import (
    DatabaseEventRegistry,
    EventSettings,
    configure_event_registry,
    run_workflows,
)

LISTEN_TIMEOUT = 10.0  # seconds to wait for the listener before saying so anyway
STATEMENT_HEAD = 70  # characters of a statement that tell its kind apart in the log
STATEMENT_SCAN = 2000  # characters searched for its verb and table (a commit's is 40 KB)


def say(word: str, value: float | int) -> None:
    """One line to the bench, flushed at once: the bench times from these lines."""
    with contextlib.suppress(BrokenPipeError):  # the bench is gone; nobody to tell
        sys.stdout.write(f"{word} {value}\n")
        sys.stdout.flush()


async def watch_stdin(stop: asyncio.Event) -> None:
    """Set `stop` when stdin reaches its end, i.e. when the bench process is gone."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    stop.set()


async def serve(args: argparse.Namespace) -> None:
    """Run one worker for the chosen workflows until a stop signal."""
    # SQLAlchemy's default pool (5 kept, 10 overflow) unless told: what a user gets.
    pool = {} if args.pool_size is None else {"pool_size": args.pool_size}
    engine = create_async_engine(args.url, **pool)
    connections = 0

    def count_connection(*_: object) -> None:
        nonlocal connections
        connections += 1

    event.listen(engine.sync_engine, "connect", count_connection)
    statements = StatementLog(by_kind=bool(args.statement_log))
    event.listen(engine.sync_engine, "before_cursor_execute", statements.before)
    event.listen(engine.sync_engine, "after_cursor_execute", statements.after)
    if args.events:
        registry = DatabaseEventRegistry(
            settings=EventSettings(mode="production", async_delivery=True)
        )
        registry.register(BENCH_EVENT_TYPE, ignore_event)
        configure_event_registry(registry)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watcher = asyncio.create_task(watch_stdin(stop))
    try:
        async with run_workflows(
            Session,
            max_concurrency=args.concurrency,
            workflows=[WORKFLOWS[name] for name in args.workflows],
            poll_interval=timedelta(seconds=args.poll_interval),
            max_idle_interval=timedelta(seconds=args.max_idle_interval),
        ) as worker:
            say("ready", time.time())
            if worker.listener is not None:
                # No listener in time: say so anyway; the bench sees it as latency.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(worker.listener.connected.wait(), LISTEN_TIMEOUT)
            say("listening", time.time())
            await stop.wait()
        say("passes", worker.passes)
        say("cpu", time.process_time())
        say("connections", connections)
        say("statements", statements.total)
        if args.statement_log:
            Path(args.statement_log).write_text(statements.as_json())
    finally:
        watcher.cancel()
        await engine.dispose()


class StatementLog:
    """Counts the statements the worker's engine sends; by kind too, under --statement-log.

    By kind, it also keeps their length, parameters and the wall time from
    sending each to its result (which includes other tasks' turns on the
    event loop while it waited): what each kind of statement costs.
    """

    def __init__(self, by_kind: bool) -> None:
        self.by_kind = by_kind
        self.total = 0
        self.kinds: dict[str, dict[str, float]] = {}

    def before(
        self, _conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, *_: Any
    ) -> None:
        """Count one statement; by kind, note when it was sent."""
        self.total += 1
        if self.by_kind and context is not None:
            context.bench_sent = time.perf_counter()

    def after(
        self, _conn: Any, _cursor: Any, statement: str, params: Any, context: Any, *_: Any
    ) -> None:
        """By kind, add the statement to its kind's totals."""
        sent = getattr(context, "bench_sent", None)
        if sent is None:
            return
        kind = self.kinds.setdefault(
            statement_kind(statement), {"count": 0, "wall_ms": 0.0, "chars": 0, "params": 0}
        )
        kind["count"] += 1
        kind["wall_ms"] += (time.perf_counter() - sent) * 1000
        kind["chars"] += len(statement)
        kind["params"] += len(params) if isinstance(params, dict) else 0

    def as_json(self) -> str:
        """Each kind's count, total wall ms, and mean characters and parameters, busiest first."""
        rows = {
            name: {
                "count": k["count"],
                "wall_ms": round(k["wall_ms"], 1),
                "mean_chars": round(k["chars"] / k["count"]),
                "mean_params": round(k["params"] / k["count"], 1),
            }
            for name, k in sorted(self.kinds.items(), key=lambda item: -item[1]["wall_ms"])
        }
        return json.dumps({"total": self.total, "kinds": rows}, indent=2)


def statement_kind(statement: str) -> str:
    """`UPDATE bench_outbox | WITH ...`: what a statement writes (or reads), and how it begins.

    The verb and table say what it does; the head tells a claim from a commit
    (both UPDATE the outbox).
    """
    text = " ".join(statement[:STATEMENT_SCAN].split())
    for verb in ("INSERT INTO", "UPDATE", "DELETE FROM", "FROM"):
        found = re.search(rf"\b{verb} (\w+)", text)
        if found:
            what = f"{'SELECT' if verb == 'FROM' else verb} {found.group(1)}"
            return f"{what} | {text[:STATEMENT_HEAD]}"
    return text[:STATEMENT_HEAD]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: database URL, workflow class names, worker options."""
    parser = argparse.ArgumentParser(description="Run one duly worker for the benchmark.")
    parser.add_argument("url", help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("workflows", nargs="+", choices=sorted(WORKFLOWS))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--max-idle-interval", type=float, default=30.0, help="seconds")
    parser.add_argument("--pool-size", type=int, default=None, help="connections kept open")
    parser.add_argument(
        "--events", action="store_true", help="route the outbox with a no-op handler"
    )
    parser.add_argument(
        "--statement-log", metavar="PATH", help="statements by kind, size and time, to PATH"
    )
    parser.add_argument("--profile", metavar="PATH", help="cProfile stats to PATH")
    return parser.parse_args(argv)


def main() -> None:
    """Serve; under cProfile when --profile asks, its stats written however the worker stops."""
    args = parse_args()
    if not args.profile:
        asyncio.run(serve(args))
        return
    profiler = cProfile.Profile()
    try:
        profiler.runcall(asyncio.run, serve(args))
    finally:
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
