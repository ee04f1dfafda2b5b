"""duly's settings, read from the environment once per process.

DULY_DATABASE_URL   the workflow database; unset: `duly dev` starts an embedded one
DULY_APP            the module that maps the workflows (default functions.examples)
DULY_HOST           where `duly dev` serves (default 127.0.0.1)
DULY_PORT           its port (default 8000)
DULY_DATA_DIR       where `duly dev` keeps the embedded PostgreSQL's data, so runs
                    survive restarts (default .duly/pgdata in the current directory)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

DEFAULT_APP = "functions.examples"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_DATA_DIR = Path(".duly") / "pgdata"  # relative to the current directory
DRIVER = "postgresql+psycopg"
PLAIN_SCHEMES = ("postgres", "postgresql")  # what hosting providers and libpq write


@dataclass(frozen=True)
class Settings:
    """Where the database is, which app module to load, and where `duly dev` serves."""

    database_url: str | None
    app_module: str = DEFAULT_APP
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    data_dir: Path = DEFAULT_DATA_DIR

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the DULY_* variables; a bad value raises ValueError naming the variable."""
        env = os.environ if environ is None else environ
        return cls(
            database_url=database_url(env.get("DULY_DATABASE_URL", "").strip() or None),
            app_module=env.get("DULY_APP", "").strip() or DEFAULT_APP,
            host=env.get("DULY_HOST", "").strip() or DEFAULT_HOST,
            port=port(env.get("DULY_PORT", "").strip() or str(DEFAULT_PORT)),
            data_dir=data_dir(env.get("DULY_DATA_DIR", "").strip() or None),
        )


def database_url(value: str | None) -> str | None:
    """The SQLAlchemy URL for `value`, with the psycopg 3 driver duly runs on."""
    if value is None:
        return None
    try:
        url = make_url(value)
    except ArgumentError:
        raise ValueError(
            "DULY_DATABASE_URL is not a database URL; "
            "write it as postgresql://user:password@host:5432/dbname."
        ) from None
    if url.drivername in PLAIN_SCHEMES:
        url = url.set(drivername=DRIVER)
    if url.drivername != DRIVER:
        raise ValueError(
            f"DULY_DATABASE_URL uses {url.drivername}://, but duly needs PostgreSQL through "
            f"psycopg 3: write postgresql:// or {DRIVER}://."
        )
    return url.render_as_string(hide_password=False)


def port(value: str) -> int:
    """A TCP port number, or ValueError naming DULY_PORT."""
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"DULY_PORT must be a whole number, not {value!r}.") from None
    if not 1 <= number <= 65535:
        raise ValueError(f"DULY_PORT must be between 1 and 65535, not {number}.")
    return number


def data_dir(value: str | None) -> Path:
    """An absolute data directory, so a later chdir does not move the database."""
    path = Path(value).expanduser() if value is not None else DEFAULT_DATA_DIR
    return path.resolve()
