"""A database secret that rotates under a warm container: read again when it is old or refused.

Secrets Manager rotates an RDS-managed secret (every 7 days by default) while a
container keeps the copy it read at its cold start. `RotatingSecret` puts the
secret's current username and password on each new connection (SQLAlchemy's
`do_connect`): it reads the secret again once its copy is older than the bound,
and when the server refuses the login (SQLSTATE 28P01 or 28000), then connects
once more with the fresh copy. Each read again is logged, never the secret.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from infra.aws.database_login import DatabaseLogin, secret_fields

log = logging.getLogger("duly.lambda")

REFUSED_LOGIN_STATES = frozenset({"28P01", "28000"})  # invalid_password, authorization
# libpq gives no SQLSTATE for a failed connection: the server's FATAL line says which.
REFUSED_LOGIN_WORDS = ("password authentication failed", "authentication failed for user")


class RotatingSecret:
    """The database URL of a Secrets Manager secret, read again when older than `max_age`
    seconds or when the server refuses its password. `read` answers the SecretString."""

    def __init__(
        self,
        read: Callable[[], str],
        login: DatabaseLogin,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._login = login
        self.max_age = max_age
        self._clock = clock
        self._url: str | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def url(self) -> str:
        """The URL of the copy kept, read afresh first if there is none or it is too old."""
        with self._lock:
            if self._url is None:
                return self._read_now(None)
            if self._clock() - self._read_at >= self.max_age:
                return self._read_now(f"the copy kept was older than {self.max_age:g} s")
            return self._url

    def refresh(self, why: str) -> str:
        """Read the secret now (`why` is logged); the new URL."""
        with self._lock:
            return self._read_now(why)

    def _read_now(self, why: str | None) -> str:
        self._url = self._login.url(secret_fields(self._read()))
        self._read_at = self._clock()
        if why is not None:
            log.info("Read the database secret again: %s.", why)
        return self._url

    def install(self, engine: AsyncEngine | Engine) -> None:
        """Log each new connection of `engine` in with the current copy; a refused login is
        tried once more with a fresh one."""
        sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine

        def with_current_secret(
            dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]
        ) -> Any:
            _log_in_as(cparams, self.url())
            try:
                return dialect.connect(*cargs, **cparams)
            except psycopg.OperationalError as error:
                if not refused_login(error):
                    raise
            _log_in_as(cparams, self.refresh("the database refused the login of the copy kept"))
            return dialect.connect(*cargs, **cparams)

        event.listen(sync_engine, "do_connect", with_current_secret)


def refused_login(error: psycopg.OperationalError) -> bool:
    """Whether `error` is the server refusing the user's password (28P01 or 28000)."""
    if error.sqlstate is not None:
        return error.sqlstate in REFUSED_LOGIN_STATES
    said = str(error)
    return any(words in said for words in REFUSED_LOGIN_WORDS)


def _log_in_as(cparams: dict[str, Any], url: str) -> None:
    parsed = make_url(url)
    cparams["user"] = parsed.username
    cparams["password"] = parsed.password
