"""Small helpers the tests share."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import pty
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import IO, Any, TypeVar

import httpx
import psutil
import uvicorn
from fastapi import FastAPI
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import configure_event_registry, get_event_registry
from engine.base.notify import EVERYONE
from engine.graphs.configure import forget_graph_runtime
from engine.worker.loop import Worker
from functions.local.command import configure_events
from infra.app_config import configure_app_graphs
from infra.settings import Settings

T = TypeVar("T")
STARTUP = 10.0  # seconds for uvicorn to start serving
REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 30.0  # seconds for `duly dev` to answer /healthz (initdb included)
EXIT_TIMEOUT = 15.0  # seconds for `duly dev` to exit after SIGINT
# `python -P -m functions.cli` is the `duly` script: -P keeps the current directory off
# sys.path, as a console script does (-m alone would put it there).
DULY = (sys.executable, "-P", "-m", "functions.cli")


async def wait_until(
    condition: Callable[[], Awaitable[object] | object],
    timeout: float = 5.0,
    interval: float = 0.005,
    what: str = "condition",
) -> None:
    """Wait until `condition()` (awaited if it is a coroutine) is truthy; fail after `timeout` s,
    saying `what` was not reached."""
    deadline = time.monotonic() + timeout
    while not await _value(condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(interval)


async def _value(result: Awaitable[object] | object) -> object:
    return await result if inspect.isawaitable(result) else result


async def look_again(worker: Worker, timeout: float = 5.0) -> None:
    """Kick `worker` into a pass and wait until that whole pass is over.

    Passes are counted as they begin and run one after another: once a second
    kicked pass has begun, the first one, which began after this call, has ended.
    """
    for _ in range(2):
        begun = worker.passes
        worker.kick(EVERYONE)
        await wait_until(lambda begun=begun: worker.passes > begun, timeout)


def connections_checked_out(engine: AsyncEngine) -> int:
    """How many of the engine's pooled connections are in use: none while a worker sleeps."""
    return int(engine.pool.checkedout())  # type: ignore[attr-defined]


async def sessions_waiting_for_a_lock(engine: AsyncEngine) -> int:
    """How many sessions of the engine's database wait for a lock another one holds."""
    async with engine.connect() as conn:
        waiting = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )
    return int(waiting or 0)


async def other_sessions_idle(engine: AsyncEngine) -> bool:
    """Whether every other client session of the engine's database is idle (none mid-statement
    or mid-transaction): a worker process on it has ended its pass and sleeps."""
    async with engine.connect() as conn:
        busy = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' AND state <> 'idle'"
            )
        )
    return busy == 0


def is_burst(started: int, buckets: int = 1) -> bool:
    """Whether `started` is a full bucket's burst (each bucket's `RATE` of tests.apps.limited).

    Real time refills buckets too, a token a second at 60 a minute, so a drain
    that took a second or two on a loaded machine may start one or two more.
    """
    # Imported when asked: a test app's workflows register when their module is imported.
    from tests.apps.limited import RATE

    return RATE * buckets <= started <= (RATE + 2) * buckets


async def fetch(Session: async_sessionmaker[AsyncSession], model: type[T], key: Any) -> T:
    """The row as the database has it now."""
    async with Session() as session:
        row = await session.get(model, key, populate_existing=True)
        assert row is not None, f"no {model.__name__} row {key!r}"
        return row


async def onboarding(Session: async_sessionmaker[AsyncSession], user_id: str) -> Any:
    """The example Onboarding run of `user_id`."""
    from functions.examples import Onboarding  # see examples_configured: loaded when asked

    async with Session() as session:
        return (
            await session.scalars(select(Onboarding).where(Onboarding.user_id == user_id))
        ).one()


@asynccontextmanager
async def serving(app: FastAPI, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Serve `app` with uvicorn on a free loopback port (`options`: more of uvicorn's
    Config); a client for it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, ws="none", lifespan="on", **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + STARTUP
        while not server.started:
            assert not task.done(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start in time"
            await asyncio.sleep(0.01)
        base_url = f"http://127.0.0.1:{port}"
        # The test's own calls reach the app's database as its requests do.
        application = getattr(app.state, "application", None)
        with application.current() if application is not None else contextlib.nullcontext():
            async with httpx.AsyncClient(base_url=base_url, trust_env=False) as client:
                yield client
    finally:
        server.should_exit = True
        await task
        sock.close()


CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


def csrf_of(page: httpx.Response) -> str:
    """The CSRF token a console page's forms carry."""
    found = CSRF.search(page.text)
    assert found is not None, page.text[:2000]
    return found.group(1)


# -- `duly` as a subprocess -------------------------------------------------------------


class Output:
    """The merged stdout and stderr of a process, collected by a thread as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def join(self) -> str:
        self._thread.join(timeout=5)
        return self.text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(condition: Callable[[], object], timeout: float, what: str, output: Output) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout} s; output:\n{output.text}")
        time.sleep(0.05)


def process_gone(pid: int) -> bool:
    """Whether pid has exited; a zombie counts (PID 1 in some containers never reaps)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def dev_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """This environment without DULY_* settings (so no DULY_DATABASE_URL), data in data_dir.

    PYTHONPATH names this checkout, so `duly` run from any directory is the code under test.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("DULY_")}
    extra = {"DULY_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}
    return env | extra | settings


@contextlib.contextmanager
def duly_process(
    *args: str, cwd: Path, env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], Output]]:
    """`duly ARGS` running, its output collected; killed and reaped at the end if still up."""
    process = subprocess.Popen(
        [*DULY, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(process)
    try:
        yield process, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        output.join()
        assert process.stdout is not None
        process.stdout.close()


def wait_healthy(process: subprocess.Popen[str], output: Output, client: httpx.Client) -> None:
    """Wait until `duly dev` answers /healthz; fail at once if it exits."""

    def healthy() -> bool:
        assert process.poll() is None, f"duly dev exited early; output:\n{output.text}"
        try:
            return bool(client.get("/healthz").json() == {"ok": True})
        except httpx.TransportError:
            return False

    wait_for(healthy, READY_TIMEOUT, "/healthz", output)


def run_duly(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`duly ARGS` to its end; its output captured."""
    return subprocess.run(
        [*DULY, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30
    )


def run_duly_on_terminal(
    *args: str, cwd: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], str]:
    """`duly ARGS` to its end with its stderr on a pseudo-terminal: the process (its stdout
    captured) and all it drew on the terminal."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.run(
            [*DULY, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=30,
        )
        os.close(terminal)
        terminal = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal's other end is closed: everything was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if terminal != -1:
            os.close(terminal)
        os.close(controller)
    return process, drawn.decode()


@contextlib.contextmanager
def examples_configured() -> Iterator[ModuleType]:
    """What `duly dev` configures for the example app: its event registry and graph runtime.

    The examples are imported here, when a test first asks, not when this file is:
    a workflow class imported during collection would be registered before the test
    apps' classes that map the same tables, and apps built without naming their
    workflows would serve it instead (the later one wins).
    """
    examples = importlib.import_module("functions.examples")
    configure_events(Settings(database_url=None), [examples.Base.metadata], get_event_registry())
    configure_app_graphs(examples.__name__)
    try:
        yield examples
    finally:
        configure_event_registry(None)
        forget_graph_runtime()
