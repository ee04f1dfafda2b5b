"""A worker process of one release: `python -m tests.apps.deploy_worker URL old|new`.

It imports that release's module only, so its code has that release's steps
and no other. Prints "ready" once its worker listens; stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from engine import run_workflows

CONCURRENCY = 4


async def serve(url: str, release: str) -> None:
    module = importlib.import_module(f"tests.apps.deploy_{release}")
    engine = create_async_engine(url, pool_size=CONCURRENCY + 2)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with run_workflows(
        Session, workflows=[module.Order], max_concurrency=CONCURRENCY
    ) as worker:
        if worker.listener is not None:
            await asyncio.wait_for(worker.listener.connected.wait(), 10)
        print("ready", flush=True)
        await stop.wait()
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("release", choices=["old", "new"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args.url, args.release))


if __name__ == "__main__":
    main()
