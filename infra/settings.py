"""duly's settings for `duly dev` and the commands: `Settings.from_env`, read once per process.

The variables (DULY_DATABASE_URL, DULY_APP, DULY_HOST, DULY_PORT,
DULY_DATA_DIR) are declared in `engine.base.settings`; this module turns the
database URL into the psycopg 3 URL duly runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from engine import ConfigurationError, settings as variables

DEFAULT_APP = variables.APP.default
DEFAULT_HOST = variables.HOST.default
DEFAULT_PORT = variables.PORT.default
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
        """Read the DULY_* variables; a bad value is a ConfigurationError (a ValueError)
        naming the variable."""
        return cls(
            database_url=database_url(variables.DATABASE_URL.read(environ)),
            app_module=variables.APP.read(environ),
            host=variables.HOST.read(environ),
            port=variables.PORT.read(environ),
            data_dir=data_dir(variables.DATA_DIR.read(environ)),
        )


def database_url(value: str | None) -> str | None:
    """The SQLAlchemy URL for `value`, with the psycopg 3 driver duly runs on."""
    if value is None:
        return None
    try:
        url = make_url(value)
    except ArgumentError:
        raise ConfigurationError(
            "DULY_DATABASE_URL is not a database URL; "
            "write it as postgresql://user:password@host:5432/dbname."
        ) from None
    if url.drivername in PLAIN_SCHEMES:
        url = url.set(drivername=DRIVER)
    if url.drivername != DRIVER:
        raise ConfigurationError(
            f"DULY_DATABASE_URL uses {url.drivername}://, but duly needs PostgreSQL through "
            f"psycopg 3: write postgresql:// or {DRIVER}://."
        )
    return url.render_as_string(hide_password=False)


def data_dir(value: str | None) -> Path:
    """An absolute data directory, so a later chdir does not move the database."""
    path = Path(value).expanduser() if value is not None else DEFAULT_DATA_DIR
    return path.resolve()
