"""One worker process of the chaos soak: `python -m bench.chaos_worker URL [--listen-url URL]`.

Serves every workflow of `bench.chaos_app` and drains its outbox. Given a
`--listen-url`, URL is a transaction-mode pooler: the engine then prepares
nothing server-side and LISTENs on the direct connection, as the Lambda
runtime does behind one. Prints "ready" once serving; SIGTERM stops it, and
the soak's driver mostly ends it with SIGKILL instead.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from bench import chaos_app
from engine import configure_event_registry, run_workflows

CONCURRENCY = 8


async def serve(url: str, listen_url: str | None) -> None:
    pooled: dict[str, Any] = {}
    if listen_url is not None:
        pooled = {"pool_pre_ping": True, "connect_args": {"prepare_threshold": None}}
    engine = create_async_engine(url, pool_size=CONCURRENCY + 2, **pooled)
    listen = create_async_engine(listen_url, pool_size=1) if listen_url else None
    configure_event_registry(chaos_app.registry())
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        async with run_workflows(
            async_sessionmaker(engine, expire_on_commit=False),
            workflows=chaos_app.WORKFLOWS,
            max_concurrency=CONCURRENCY,
            lease=timedelta(seconds=chaos_app.LEASE_SECONDS),
            max_idle_interval=timedelta(seconds=2),
            listen_engine=listen,
        ) as worker:
            if worker.listener is not None:
                await asyncio.wait_for(worker.listener.connected.wait(), 20)
            print("ready", flush=True)
            await stop.wait()
    finally:
        await engine.dispose()
        if listen is not None:
            await listen.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--listen-url")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(serve(args.url, args.listen_url))


if __name__ == "__main__":
    main()
