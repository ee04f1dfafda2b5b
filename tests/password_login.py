"""Roles whose password the test server really checks, for the database login tests.

The embedded server trusts every local connection. Members of `PASSWORD_GROUP`
must give their password (scram-sha-256): a rule for the group goes first in
its pg_hba.conf, once, then a reload. Another server that takes any password
skips these tests. `tcp_port` pipes a loopback TCP port to the unix socket, for
a client that must name a host (an IAM token is signed for a host and port).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from infra.testing.pytest_plugin import Database, Server
from tests.helpers import wait_until

PASSWORD_GROUP = "duly_password_login"
HBA_LINE = f"local all +{PASSWORD_GROUP} scram-sha-256\n"
RELOAD_TIMEOUT = 10.0  # seconds for the postmaster to take the new pg_hba.conf


@dataclass(frozen=True)
class Socket:
    """Where the test server listens: a unix socket's directory and its port."""

    directory: str
    port: int

    @classmethod
    def of(cls, db: Database) -> Socket:
        url = make_url(db.url)
        query = {k: v if isinstance(v, str) else v[-1] for k, v in url.query.items()}
        return cls(query.get("host") or url.host or "/tmp", int(query.get("port") or 5432))


def admin(db: Database, statement: sql.Composable) -> None:
    """Run one statement as the test server's superuser."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute(statement)


def set_password(db: Database, role: str, password: str) -> None:
    """Make `password` the role's (any text: it is sent as a literal, never as SQL)."""
    admin(
        db,
        sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)),
    )


def logs_in(db: Database, role: str, password: str) -> bool:
    """Whether `role` logs in to the test's database with `password`."""
    socket = Socket.of(db)
    try:
        with psycopg.connect(
            host=socket.directory,
            port=socket.port,
            dbname=db.name,
            user=role,
            password=password,
            connect_timeout=5,
        ):
            return True
    except psycopg.OperationalError as refused:
        if "password authentication failed" not in str(refused):
            raise
        return False


@contextlib.asynccontextmanager
async def password_role(
    db: Database, server: Server, password: str, *, superuser: bool = False
) -> AsyncIterator[str]:
    """A new login role with `password`, which the server checks; dropped on exit.
    `superuser=True` lets it use the tables the test made as the server's superuser."""
    admin(
        db,
        sql.SQL(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {}) "
            "THEN CREATE ROLE {} NOLOGIN; END IF; END $$"
        ).format(sql.Literal(PASSWORD_GROUP), sql.Identifier(PASSWORD_GROUP)),
    )
    role = f"duly_login_{uuid.uuid4().hex[:8]}"
    kind = sql.SQL("SUPERUSER" if superuser else "NOSUPERUSER")
    admin(
        db,
        sql.SQL("CREATE ROLE {} LOGIN {} PASSWORD {} IN ROLE {}").format(
            sql.Identifier(role), kind, sql.Literal(password), sql.Identifier(PASSWORD_GROUP)
        ),
    )
    try:
        await check_passwords(db, server, role)
        yield role
    finally:
        admin(db, sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(role)))
        admin(db, sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin(db, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def check_passwords(db: Database, server: Server, role: str) -> None:
    """Make the server check `role`'s password (it is a member of PASSWORD_GROUP)."""
    wrong = uuid.uuid4().hex
    if not logs_in(db, role, wrong):
        return
    if server.embedded is None:
        pytest.skip("DULY_TEST_DATABASE_URL's server takes any password: nothing to check")
    [(hba_file,)] = db.sql("SHOW hba_file")
    hba = Path(str(hba_file))
    rules = hba.read_text()
    if HBA_LINE not in rules:
        hba.write_text(HBA_LINE + rules)
    db.sql("SELECT pg_reload_conf()")
    await wait_until(
        lambda: not logs_in(db, role, wrong),
        timeout=RELOAD_TIMEOUT,
        what="the server checking passwords",
    )


@contextlib.asynccontextmanager
async def tcp_port(db: Database) -> AsyncIterator[int]:
    """A loopback TCP port whose every connection is piped, byte for byte, to the test server's
    unix socket (where `local` rules of pg_hba.conf apply); served on the running loop."""
    socket = Socket.of(db)
    path = f"{socket.directory}/.s.PGSQL.{socket.port}"

    async def forward(client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        server, to_server = await asyncio.open_unix_connection(path)
        await asyncio.gather(_pipe(client, to_server), _pipe(server, to_client))

    listening = await asyncio.start_server(forward, "127.0.0.1", 0)
    try:
        yield int(listening.sockets[0].getsockname()[1])
    finally:
        listening.close()
        await listening.wait_closed()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        sink.close()
