"""The serverless path, measured in `duly dev --serverless`'s emulation: wake lateness, step gaps.

moto stands in for EventBridge Scheduler and the firer of `functions.local.serverless` invokes
the real wake entry when the registered `at()` comes due, as on AWS, in this process (the
app: `bench.serverless_app`). Runs start through `connect_workflows`, whose commit kicks reach
the firer as an HTTP start's do. bench/README.md says how each figure is taken;
`--pause-after` puts `tests/pausing_proxy.py`'s proxy in front of the embedded PostgreSQL:
the same figures through a resume.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from bench import serverless_app  # noqa: E402
from bench.measures import percentiles  # noqa: E402
from bench.serverless_app import PathChain, PathTimer  # noqa: E402
from engine import connect_workflows  # noqa: E402
from functions.local.serverless import (  # noqa: E402
    Firer,
    LocalAws,
    local_settings,
    prepare_tables,
)
from infra.embedded import start_embedded  # noqa: E402

APP = "bench.serverless_app"
SEED = 20261205
WARMUP_TIMERS = 3  # timers and chains run first and left out: the container's first steps
WARMUP_CHAINS = 2
WAIT_SLACK = 15.0  # seconds past the last due instant before a measurement fails
# The through-a-resume figures: this path behind a proxy that stops PostgreSQL while no client
# is connected and starts it on the next connect (its module: the tests' pausing database).
PAUSING_PROXY = "tests.pausing_proxy"


@dataclass(frozen=True)
class Sizes:
    """How much each figure measures."""

    dense: int  # wake_in runs armed at once, due over `dense_s` seconds (several a second)
    dense_s: float
    sparse: int  # wake_in runs armed at once, due SPARSE_GAP_S apart: each wake from the schedule
    chains: int  # chains, one at a time
    hops: int  # steps a chain


FULL = Sizes(dense=100, dense_s=20.0, sparse=30, chains=20, hops=11)
QUICK = Sizes(dense=20, dense_s=4.0, sparse=6, chains=5, hops=11)
FIRST_DUE_S = 2.0  # the earliest delay: every run is armed before any comes due
SPARSE_GAP_S = 2.0  # further apart than a wake waits within its invocation (a second)


def spread(n: int, width: float, seed: int) -> list[float]:
    """`n` offsets evenly over [0, width), in a fixed shuffled order."""
    found = [width * i / n for i in range(n)]
    random.Random(seed).shuffle(found)
    return found


def dense_delays(sizes: Sizes) -> list[float]:
    """Delays in seconds, evenly over FIRST_DUE_S to FIRST_DUE_S + dense_s."""
    return [FIRST_DUE_S + d for d in spread(sizes.dense, sizes.dense_s, SEED)]


def sparse_delays(sizes: Sizes) -> list[float]:
    """Delays SPARSE_GAP_S apart, each at an evenly spread fraction of its second."""
    phases = spread(sizes.sparse, 1.0, SEED + 1)
    return [FIRST_DUE_S + SPARSE_GAP_S * i + phase for i, phase in enumerate(phases)]


async def wait_until(done: Any, timeout: float, what: str) -> None:
    """Poll `done()` every 10 ms (memory only, no query) until true; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done in {timeout:.0f} s")
        await asyncio.sleep(0.01)


async def create_tables(engine: AsyncEngine) -> None:
    """The bench app's tables, fresh, and the schedule row's and slots' (cleared)."""
    async with engine.begin() as conn:
        await conn.run_sync(serverless_app.Base.metadata.drop_all)
        await conn.run_sync(serverless_app.Base.metadata.create_all)
    await prepare_tables(engine)
    await engine.dispose()


async def measure_timers(
    Session: Any, firer: Firer, delays: list[float], first: int
) -> dict[str, Any]:
    """Arm one timer per delay at once; how late each timed step started after its instant."""
    ids = range(first, first + len(delays))
    async with connect_workflows(Session, workflows=[PathTimer]) as connection:
        connection.kicks.append(lambda _workflow: firer.kick())
        for key, delay in zip(ids, delays, strict=True):
            await PathTimer(id=key, delay_ms=round(delay * 1000)).start(PathTimer.arm)
    fired = serverless_app.FIRED
    await wait_until(lambda: all(key in fired for key in ids), max(delays) + WAIT_SLACK, "timers")
    due = {key: serverless_app.DUE[key] for key in ids}
    late = [(fired[key] - due[key]) * 1000 for key in ids]
    # The schedule's at() is a whole second, rounded up: what the firer and the wake add to it.
    beyond = [(fired[key] - math.ceil(due[key])) * 1000 for key in ids]
    return {
        "runs": len(delays),
        "lateness_ms": percentiles(late),
        "after_the_registered_second_ms": percentiles(beyond),
    }


async def measure_chains(Session: Any, firer: Firer, sizes: Sizes, ids: range) -> dict[str, Any]:
    """Start each chain and wait for its last step; the gaps between its steps' starts."""
    gaps: list[float] = []
    async with connect_workflows(Session, workflows=[PathChain]) as connection:
        connection.kicks.append(lambda _workflow: firer.kick())
        for key in ids:
            await PathChain(id=key, hops=sizes.hops).start(PathChain.hop)
            starts = serverless_app.HOPS[key]
            await wait_until(lambda s=starts: len(s) >= sizes.hops, WAIT_SLACK, "a chain")
            gaps.extend((b - a) * 1000 for a, b in itertools.pairwise(starts))
    return {"step_to_step_ms": percentiles(gaps), "gaps": len(gaps)}


async def measure_serverless_path(url: str, sizes: Sizes) -> dict[str, Any]:
    """moto, the firer's wake container and a client on `url`; timers, then chains."""
    engine = create_async_engine(url, poolclass=NullPool)  # the bench holds none while idle
    await create_tables(engine)
    aws = LocalAws()
    aws.start()
    firer = Firer(local_settings(url, APP), aws.client)
    try:
        await asyncio.to_thread(firer.start)
        Session = async_sessionmaker(engine, expire_on_commit=False)
        await measure_timers(Session, firer, [FIRST_DUE_S] * WARMUP_TIMERS, 1)
        first = 1 + WARMUP_TIMERS
        dense = await measure_timers(Session, firer, dense_delays(sizes), first)
        first += sizes.dense
        sparse = await measure_timers(Session, firer, sparse_delays(sizes), first)
        await measure_chains(Session, firer, sizes, range(1, 1 + WARMUP_CHAINS))
        chains = await measure_chains(
            Session, firer, sizes, range(1 + WARMUP_CHAINS, 1 + WARMUP_CHAINS + sizes.chains)
        )
    finally:
        await asyncio.to_thread(firer.stop)
        aws.stop()
        await engine.dispose()
    return {
        "sizes": asdict(sizes),
        "dense": dense,
        "sparse": sparse,
        **chains,
        "wake_invocations": firer.invocations,
        "clock_reads": firer.clock_reads,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="about 5x fewer timers and chains")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--database-url", help="PostgreSQL to run on (default: an embedded one)")
    where.add_argument(
        "--pause-after",
        type=float,
        help="through a resume: the embedded PostgreSQL behind a pausing proxy "
        f"({PAUSING_PROXY}) that stops it this many seconds after its last client left",
    )
    parser.add_argument(
        "--resume-delay", type=float, default=0.0, help="with --pause-after: a resume's least"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser.parse_args(argv)


@contextlib.contextmanager
def database(args: argparse.Namespace) -> Iterator[tuple[str, Any]]:
    """The URL to measure on, and the pausing proxy if there is one; stopped after."""
    if args.database_url:
        yield args.database_url, None
        return
    server = start_embedded()
    try:
        if args.pause_after is None:
            yield server.url, None
            return
        try:
            proxies = importlib.import_module(PAUSING_PROXY)
        except ModuleNotFoundError:
            raise SystemExit(f"--pause-after needs {PAUSING_PROXY}, not in this tree.") from None
        proxy = proxies.PausingProxy(
            server, pause_after=args.pause_after, resume_delay=args.resume_delay
        ).start()
        try:
            yield proxy.url(), proxy
        finally:
            proxy.close()
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """Measure on the given database or a fresh embedded one; print the figures as JSON."""
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    with database(args) as (url, proxy):
        found = asyncio.run(measure_serverless_path(url, sizes))
        if proxy is not None:
            found["pause"] = {
                "pause_after_s": args.pause_after,
                "resume_delay_s": args.resume_delay,
                "idle_windows": len(proxy.idle_windows()),
            }
    text = json.dumps(found, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
