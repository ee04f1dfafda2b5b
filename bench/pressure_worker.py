"""One worker process of the pressure bench: `python -m bench.pressure_worker URL [--lease S]
[--concurrency N]`.

Serves `Probe` with `run_workflows(max_concurrency=N)` (32 unless told) on a pool whose
connections are named WORKER_APPLICATION (so the bench can terminate them)
and pinged on checkout (a terminated connection is replaced, not used).
Prints `ready <time.time()>` once its listener is up; stops on SIGTERM or
when its stdin closes (the bench is gone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench.pressure_app import WORKER_APPLICATION, Probe
from engine import run_workflows

# Steps at a time unless told: a worker process serving a steady stream, whose passes then
# claim and whose commits flush up to this many rows at once (bench/README.md).
CONCURRENCY = 32
LISTEN_TIMEOUT = 10.0  # seconds to wait for the LISTEN connection before saying ready anyway


async def watch_stdin(stop: asyncio.Event) -> None:
    """Set `stop` when stdin reaches its end."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    stop.set()


async def serve(url: str, lease_s: float | None, concurrency: int) -> None:
    engine = create_async_engine(
        url, pool_pre_ping=True, connect_args={"application_name": WORKER_APPLICATION}
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watcher = asyncio.create_task(watch_stdin(stop))
    lease: dict[str, Any] = {} if lease_s is None else {"lease": timedelta(seconds=lease_s)}
    try:
        async with run_workflows(
            async_sessionmaker(engine, expire_on_commit=False),
            workflows=[Probe],
            max_concurrency=concurrency,
            **lease,
        ) as worker:
            if worker.listener is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(worker.listener.connected.wait(), LISTEN_TIMEOUT)
            print(f"ready {time.time()}", flush=True)
            await stop.wait()
    finally:
        watcher.cancel()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--lease", type=float, default=None, help="seconds (engine default)")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="steps at a time")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # terminated connections log warnings by design
    asyncio.run(serve(args.url, args.lease, args.concurrency))


if __name__ == "__main__":
    main()
