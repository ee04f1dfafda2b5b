"""One benchmark worker process: serves the named workflows until told to stop.

The bench measures a worker in a process of its own, as it runs in production,
so the bench's own polling and starting never share its event loop. It speaks
on stdout, one line each: `ready <time.time()>` once its `run_workflows` block
is entered, `listening <time.time()>` once its LISTEN connection is up, and
`passes <n>`, `cpu <seconds>` (its own CPU time) and `connections <n>` (what its
SQLAlchemy pool opened, the listener's aside) on its way out. It stops
on SIGTERM, SIGINT, or its stdin closing: the last so a bench that dies
without cleaning up does not leave it running.

    python -m bench.worker_process URL NoOp [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from datetime import timedelta

from sqlalchemy import event
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.models import WORKFLOWS
from engine import run_workflows

LISTEN_TIMEOUT = 10.0  # seconds to wait for the listener before saying so anyway


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
    finally:
        watcher.cancel()
        await engine.dispose()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: database URL, workflow class names, worker options."""
    parser = argparse.ArgumentParser(description="Run one duly worker for the benchmark.")
    parser.add_argument("url", help="SQLAlchemy URL (postgresql+psycopg://...)")
    parser.add_argument("workflows", nargs="+", choices=sorted(WORKFLOWS))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--max-idle-interval", type=float, default=30.0, help="seconds")
    parser.add_argument("--pool-size", type=int, default=None, help="connections kept open")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(serve(parse_args()))
