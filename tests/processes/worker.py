"""A worker process for tests: `python -m tests.processes.worker URL [options]`.

Prints "ready" once its worker is running, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from datetime import timedelta

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from engine import configure_event_registry, run_workflows
from engine.worker.options import LEASE
from tests.apps import chain, effects, limited, outbox

WORKFLOWS = {
    "chain3": chain.Chain,
    "slow": chain.Slow,
    "timed": chain.Timed,
    "lookup": limited.Lookup,
    "burst": limited.Burst,
    "outbox": outbox.Outbox,
    "charge": effects.Charge,
    "parcel": effects.Parcel,
}


async def serve(args: argparse.Namespace) -> None:
    engine = create_async_engine(args.url, pool_size=args.concurrency + 2)
    Session = async_sessionmaker(engine, expire_on_commit=False)
    if "outbox" in args.workflows.split(","):
        configure_event_registry(outbox.process_registry())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with run_workflows(
        Session,
        workflows=[WORKFLOWS[name] for name in args.workflows.split(",")],
        max_concurrency=args.concurrency,
        lease=timedelta(seconds=args.lease),
        max_idle_interval=timedelta(seconds=args.idle),
    ) as worker:
        if worker.listener is not None:
            await asyncio.wait_for(worker.listener.connected.wait(), 10)
        print("ready", flush=True)
        await stop.wait()
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--workflows", default="chain3")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease", type=float, default=LEASE.total_seconds())
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
