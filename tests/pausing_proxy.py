"""A database that pauses: a loopback TCP proxy that stops PostgreSQL while nobody is connected.

Aurora Serverless v2 at 0 ACU and Neon stop their compute after a while with no
client connection and start it again on the next connect, which then waits for the
resume. `PausingProxy` does the same in front of an embedded PostgreSQL of its own:
`pause_after` seconds after its last client left it stops the server (`pg_ctl stop -m
fast`), and the next client to connect is held while the server starts again, for
`resume_delay` seconds at least, before its bytes are piped to the server's unix
socket. The stops and starts are real. It runs on a thread and loop of its own, so a
test's loop, a Lambda container's thread or the bench can use it alike, and it keeps
what the assertions read: the clients connected now, and when the server was stopped
(`stopped_within`) and nobody was connected (`idle_windows`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from infra.embedded import EmbeddedPostgres, start_embedded

log = logging.getLogger("tests.pausing_proxy")

HOST = "127.0.0.1"
SOCKET_NAME = ".s.PGSQL.5432"  # the embedded server's socket file, in its socket dir
CHUNK = 1 << 16  # bytes read at once
WATCH_INTERVAL = 0.02  # seconds between looks at whether the server may pause
START_TIMEOUT = 10.0  # seconds for the proxy's loop to listen


@dataclass(frozen=True)
class Window:
    """A stretch of time (time.monotonic()) with no client connected, and how long of it
    the server was stopped."""

    start: float
    end: float
    stopped: float

    @property
    def length(self) -> float:
        return self.end - self.start


class PausingProxy:
    """A TCP proxy on loopback in front of `server`'s unix socket that pauses and resumes it."""

    def __init__(
        self, server: EmbeddedPostgres, *, pause_after: float, resume_delay: float = 0.0
    ) -> None:
        self.server = server
        self.pause_after = pause_after
        self.resume_delay = resume_delay
        self.port = 0
        self.pauses = 0  # times the server was stopped
        self.resumes = 0  # times it was started again
        self.most_open = 0  # the most client connections at once
        self._open = 0
        self._lock = threading.Lock()  # guards what the test's thread reads
        self._stopped_at: float | None = None  # when the current stop began, if stopped
        self._stops: list[tuple[float, float]] = []  # finished stops: (began, ended)
        self._idle_since: float | None = time.monotonic()
        self._windows: list[tuple[float, float]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._state: asyncio.Lock | None = None  # one stop or start at a time, on the loop
        self._listening: asyncio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        self._clients: set[asyncio.Task[Any]] = set()  # each client's piping, on the loop

    # -- what a test reads -------------------------------------------------------------

    @property
    def open(self) -> int:
        """Client connections open now."""
        with self._lock:
            return self._open

    @property
    def stopped(self) -> bool:
        """Whether the server is stopped (or stopping) now."""
        with self._lock:
            return self._stopped_at is not None

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL (psycopg 3) of `database` through the proxy."""
        return f"postgresql+psycopg://postgres@{HOST}:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        """The libpq URL of `database` through the proxy."""
        return self.url(database).replace("+psycopg", "", 1)

    def stopped_within(self, start: float, end: float) -> float:
        """Seconds between `start` and `end` (time.monotonic()) the server was stopped."""
        with self._lock:
            stops = list(self._stops)
            if self._stopped_at is not None:
                stops.append((self._stopped_at, time.monotonic()))
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in stops)

    def idle_windows(self) -> list[Window]:
        """Each finished stretch with no client connected, from the last client's leaving to
        the next one's connecting, with the seconds of it the server was stopped."""
        with self._lock:
            windows = list(self._windows)
        return [Window(a, b, self.stopped_within(a, b)) for a, b in windows]

    # -- starting and stopping the proxy ------------------------------------------------

    def start(self) -> PausingProxy:
        """Listen on a free loopback port; the server is left running until it may pause."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(START_TIMEOUT)
        return self

    def close(self) -> None:
        """Stop listening and watching; the server is started again if it was paused."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _listen(self) -> None:
        self._state = asyncio.Lock()
        self._listening = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self._listening.sockets[0].getsockname()[1]
        self._watch = asyncio.create_task(self._pause_when_idle())

    async def _shut(self) -> None:
        assert self._listening is not None and self._watch is not None
        self._listening.close()
        for task in (self._watch, *self._clients):
            task.cancel()
        await asyncio.gather(self._watch, *self._clients, return_exceptions=True)
        await self._running()

    # -- the server's pauses ------------------------------------------------------------

    async def _pause_when_idle(self) -> None:
        """Stop the server once no client has been connected for `pause_after` seconds."""
        assert self._state is not None
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            with self._lock:
                idle = self._idle_since
                due = idle is not None and self._stopped_at is None
            if not due or time.monotonic() - idle < self.pause_after:  # type: ignore[operator]
                continue
            async with self._state:
                with self._lock:
                    if self._open or self._stopped_at is not None:
                        continue
                    self._stopped_at = time.monotonic()
                await asyncio.to_thread(self.server.pause)
                self.pauses += 1
                log.info("paused the database after %.2f s idle", self.pause_after)

    async def _running(self) -> None:
        """Start the server if it is stopped, taking `resume_delay` seconds at least."""
        assert self._state is not None
        async with self._state:
            if self._stopped_at is None:
                return
            began = time.monotonic()
            await asyncio.to_thread(self.server.resume)
            await asyncio.sleep(max(0.0, self.resume_delay - (time.monotonic() - began)))
            with self._lock:
                assert self._stopped_at is not None
                self._stops.append((self._stopped_at, began))
                self._stopped_at = None
            self.resumes += 1
            log.info("resumed the database in %.2f s", time.monotonic() - began)

    # -- a client -------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        task.add_done_callback(self._clients.discard)
        with self._lock:
            if self._open == 0 and self._idle_since is not None:
                self._windows.append((self._idle_since, time.monotonic()))
            self._open += 1
            self.most_open = max(self.most_open, self._open)
            self._idle_since = None
        try:
            await self._running()
            socket = str(self.server.socket_dir / SOCKET_NAME)
            up_reader, up_writer = await asyncio.open_unix_connection(socket)
            try:
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            finally:
                up_writer.close()
        except OSError as error:
            log.warning("the proxy could not reach the server: %s", error)
        except asyncio.CancelledError:
            pass  # the proxy is closing: the client's connection ends with it
        finally:
            writer.close()
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    self._idle_since = time.monotonic()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until either side ends; then end the writer's side too."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


@contextlib.contextmanager
def pausing_database(pause_after: float, resume_delay: float = 0.0) -> Iterator[PausingProxy]:
    """A PostgreSQL server of its own behind a `PausingProxy`, both stopped at the end."""
    server = start_embedded(tuned_for_tests=True)
    proxy = PausingProxy(server, pause_after=pause_after, resume_delay=resume_delay)
    try:
        yield proxy.start()
    finally:
        proxy.close()
        server.stop()


@pytest.fixture
def pausing_proxy(request: pytest.FixtureRequest) -> Iterator[PausingProxy]:
    """A pausing database (`pausing_database`); `@pytest.mark.parametrize("pausing_proxy",
    [(pause_after, resume_delay)], indirect=True)` sets its timings (default 0.25 s, 1 s)."""
    pause_after, resume_delay = getattr(request, "param", (0.25, 1.0))
    with pausing_database(pause_after, resume_delay) as proxy:
        yield proxy
