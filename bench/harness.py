"""What every measurement runs in: a fresh database, and a worker in a process of its own.

A fresh database per measurement, so no figure inherits another's dead rows
or bloated index; the worker in a subprocess, as in production, so the
bench's own starting and polling never share its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Table, func, insert, literal, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from bench.models import Base
from engine import Workflow
from engine.base.notify import CHANNEL  # the channel start() announces on, for its batch inserts
from infra.embedded import EmbeddedPostgres

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER_CONCURRENCY = 8  # steps at a time in the one worker process, as the peers were run
POLL_EVERY = 0.020  # seconds between the bench's "is everything done?" counts
STALL_TIMEOUT = 15.0  # seconds without one run finishing before a measurement fails
READY_TIMEOUT = 60.0  # seconds for a worker process to import and enter run_workflows
STOP_TIMEOUT = 15.0  # seconds a worker gets to stop on SIGTERM before it is killed
EMPTY_ARGS: dict[str, Any] = {
    "args": [],
    "kwargs": {},
}  # next_args of a step called without arguments


class BenchDatabase:
    """A fresh database on the embedded server, with every bench table created empty."""

    def __init__(self, server: EmbeddedPostgres, name: str) -> None:
        self.name = name
        self.url = server.url_for(name)
        self.conninfo = server.conninfo_for(name)
        self._admin = server.conninfo_for("postgres")
        self._engine: AsyncEngine | None = None

    async def __aenter__(self) -> BenchDatabase:
        async with await psycopg.AsyncConnection.connect(self._admin, autocommit=True) as conn:
            name = sql.Identifier(self.name)
            await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
        self._engine = create_async_engine(self.url)
        async with self._engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._engine is not None:
            await self._engine.dispose()

    @property
    def engine(self) -> AsyncEngine:
        """The bench side's SQLAlchemy engine on this database."""
        if self._engine is None:
            raise RuntimeError(f"Database {self.name} is used outside its 'async with' block.")
        return self._engine

    def sessionmaker(self) -> async_sessionmaker[AsyncSession]:
        """A session factory as an application builds one."""
        return async_sessionmaker(self.engine, expire_on_commit=False)

    async def scalar(self, query: str | sql.Composed, *params: object) -> Any:
        """The first column of the first row of one statement, on a connection of its own."""
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            cursor = await conn.execute(query, params or None)
            row = await cursor.fetchone() if cursor.description else None
        return None if row is None else row[0]


async def insert_due_runs(
    db: BenchDatabase, model: type[Workflow], first_step: str, n: int, announce: bool = False
) -> None:
    """Insert `n` runs of `model`, all due now at `first_step`, in one statement.

    One INSERT rather than n start() calls: the figure is the worker's, and
    every row must be waiting before it starts. ANALYZE then gives the planner
    the statistics autovacuum would have gathered on a table in service.
    `announce` NOTIFYs a worker that is already running, in the same commit,
    as start() does.
    """
    table = model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, Table)
    rows = select(literal(first_step), literal(EMPTY_ARGS, JSONB), func.now()).select_from(
        func.generate_series(1, n)
    )
    async with db.engine.begin() as conn:
        await conn.execute(insert(table).from_select(["next_step", "next_args", "wake_at"], rows))
        if announce:
            await conn.execute(select(func.pg_notify(CHANNEL, table.name)))
    await db.scalar(sql.SQL("ANALYZE {}").format(sql.Identifier(table.name)))


async def wait_until_done(
    db: BenchDatabase,
    table: str,
    worker: WorkerProcess,
    conn: psycopg.AsyncConnection[Any] | None = None,
) -> float:
    """Count `table`'s unfinished runs every POLL_EVERY until none is left; return time.time().

    Fails when the worker process has exited, or the count has not moved for
    STALL_TIMEOUT: a healthy worker finishes something between two polls, so
    the bench reports a stuck engine instead of hanging on it. It counts on
    `conn` (autocommit) when given, else on a connection of its own.
    """
    query = sql.SQL("SELECT count(*) FROM {} WHERE next_step IS NOT NULL").format(
        sql.Identifier(table)
    )
    return await wait_until_none(db, query, worker, f"runs of {table} unfinished", conn)


async def wait_until_none(
    db: BenchDatabase,
    query: sql.SQL | sql.Composed,
    worker: WorkerProcess,
    what: str,
    conn: psycopg.AsyncConnection[Any] | None = None,
) -> float:
    """Run `query` (a count) every POLL_EVERY until it says 0; return time.time() then.

    The same failures as wait_until_done; `what` names what is counted ("runs of
    t unfinished") in their messages.
    """
    if conn is None:
        async with await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as own:
            return await wait_until_none(db, query, worker, what, own)
    last_pending: int | None = None
    last_change = time.monotonic()
    while True:
        row = await (await conn.execute(query)).fetchone()
        pending = row[0] if row else 0
        if pending == 0:
            return time.time()
        if worker.exit_code is not None:
            raise RuntimeError(
                f"The worker process exited (status {worker.exit_code}) with {pending} "
                f"{what}; its stderr is above."
            )
        if pending != last_pending:
            last_pending, last_change = pending, time.monotonic()
        elif time.monotonic() - last_change > STALL_TIMEOUT:
            raise RuntimeError(f"{pending} {what} after {STALL_TIMEOUT:.0f} s without progress.")
        await asyncio.sleep(POLL_EVERY)


async def check_no_failures(db: BenchDatabase, table: str) -> None:
    """Refuse a figure that counted failed attempts: it would measure the wrong thing."""
    query = sql.SQL("SELECT count(*) FROM {} WHERE attempts > 0 OR last_error IS NOT NULL")
    failed = int(await db.scalar(query.format(sql.Identifier(table))))
    if failed:
        raise RuntimeError(f"{failed} runs of {table} failed an attempt; see the worker's log.")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` so far; 0.0 where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(server: EmbeddedPostgres) -> dict[int, float]:
    """CPU seconds (user + system) of each of the server's processes now, by pid.

    Its backends and background processes are the postmaster's children; the
    difference of two readings is the server's CPU between them (a backend
    that exited in between is missed: the worker's pooled ones do not). Empty
    where there is no /proc.
    """
    postmaster = server.postmaster_pid
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    if postmaster is None:
        return found
    for pid, fields in children_of(postmaster):
        found[pid] = (int(fields[11]) + int(fields[12])) / tick
    return found


def children_of(parent: int) -> Iterator[tuple[int, list[str]]]:
    """The pid and /proc stat fields (after the command, which may hold spaces) of each
    live child of `parent`; nothing where there is no /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone since the listing
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent:  # fields[1] is the parent pid
            yield int(entry.name), fields


def cpu_since(server: EmbeddedPostgres, before: dict[int, float]) -> float:
    """The server's CPU seconds since the `before` reading of server_cpu()."""
    return sum(now - before.get(pid, 0.0) for pid, now in server_cpu(server).items())


class WorkerProcess:
    """One `bench.worker_process` subprocess, stopped (or killed) however the block ends."""

    def __init__(
        self,
        db: BenchDatabase,
        workflows: Sequence[str],
        pool_size: int | None,
        concurrency: int = WORKER_CONCURRENCY,
        options: Sequence[str] = (),
    ) -> None:
        self.command = [
            sys.executable,
            "-m",
            "bench.worker_process",
            db.url,
            *workflows,
            "--concurrency",
            str(concurrency),
            *options,  # worker_process's own (--events, --profile PATH)
        ]
        if pool_size is not None:
            self.command += ["--pool-size", str(pool_size)]
        self.process: asyncio.subprocess.Process | None = None
        self.ready_at = 0.0  # time.time() the worker printed on entering run_workflows
        self.listening_at = 0.0  # time.time() its LISTEN connection was up
        self.passes: int | None = None  # claim passes it made, printed as it stops
        self.cpu_seconds: float | None = None  # its CPU time (user + system), likewise
        self.connections: int | None = None  # connections its SQLAlchemy pool opened, likewise
        self.statements: int | None = None  # statements its SQLAlchemy engine sent, likewise

    async def __aenter__(self) -> WorkerProcess:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            cwd=REPO_ROOT,
            # Open and unused: the worker exits when it closes, i.e. when we die.
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # stderr is ours: its warnings and tracebacks show where they happen.
        )
        try:
            self.ready_at = await self._expect("ready")
            self.listening_at = await self._expect("listening")
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def cpu_now(self) -> float:
        """Its CPU seconds so far, read from /proc while it runs (0.0 before it starts)."""
        return 0.0 if self.process is None else process_cpu(self.process.pid)

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once it has ended by itself or been stopped, else None."""
        return None if self.process is None else self.process.returncode

    async def _expect(self, word: str) -> float:
        assert self.process is not None and self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), READY_TIMEOUT)
        parts = line.decode().split()
        if len(parts) != 2 or parts[0] != word:
            raise RuntimeError(
                f"The worker process said {line!r} where '{word} <time>' was expected; "
                "its stderr is above."
            )
        return float(parts[1])

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; read the counts it printed."""
        if self.process is None:
            return
        for line in (await stop_process(self.process)).decode().splitlines():
            word, _, value = line.partition(" ")
            if word == "passes":
                self.passes = int(value)
            elif word == "cpu":
                self.cpu_seconds = float(value)
            elif word == "connections":
                self.connections = int(value)
            elif word == "statements":
                self.statements = int(value)


async def stop_process(process: asyncio.subprocess.Process, timeout: float = STOP_TIMEOUT) -> bytes:
    """SIGTERM, then SIGKILL after `timeout` seconds; what it printed on stdout meanwhile.

    Nothing when it had already ended or had to be killed.
    """
    if process.returncode is not None:
        return b""
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        rest, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return b""
    return rest
