"""Where the AWS functions' database is and how they log in, as AWS makes databases.

A generic JSON secret (host, port, username, password, dbname, engine), an
RDS-managed master user secret (username and password only: DULY_DATABASE_HOST,
_PORT and _NAME say the rest), or IAM database authentication
(DULY_DATABASE_IAM_AUTH: no password at all; `infra.aws.iam_auth` puts a fresh token
on each connection). The settings win over the secret's fields, so an RDS Proxy's
endpoint replaces the instance's. A refusal names the field, never a secret's value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL, make_url

from engine import ConfigurationError, settings as variables
from infra.settings import DRIVER

DEFAULT_PORT = 5432
DEFAULT_DBNAME = "postgres"  # what RDS connects to when nothing names a database
IAM_SSLMODE = "require"  # RDS and RDS Proxy take an IAM token over TLS only
POSTGRES_ENGINES = frozenset({"postgres", "postgresql", "aurora-postgresql"})
HOST_HINT = (
    "an RDS-managed master user secret holds only username and password: set "
    f"{variables.DATABASE_HOST.name} (and {variables.DATABASE_PORT.name} and "
    f"{variables.DATABASE_NAME.name} when they are not {DEFAULT_PORT} and {DEFAULT_DBNAME})"
)


@dataclass(frozen=True)
class DatabaseLogin:
    """The database settings that win over the secret's fields, and how to log in."""

    host: str | None = None
    port: int | None = None
    name: str | None = None
    user: str | None = None
    iam_auth: bool = False
    sslmode: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DatabaseLogin:
        """DULY_DATABASE_HOST, _PORT, _NAME, _USER, _IAM_AUTH and _SSLMODE."""
        return cls(
            host=variables.DATABASE_HOST.read(environ),
            port=variables.DATABASE_PORT.read(environ),
            name=variables.DATABASE_NAME.read(environ),
            user=variables.DATABASE_USER.read(environ),
            iam_auth=variables.DATABASE_IAM_AUTH.read(environ),
            sslmode=variables.DATABASE_SSLMODE.read(environ),
        )

    @property
    def ssl(self) -> str | None:
        """The sslmode to connect with: the setting's, else `require` with IAM auth."""
        return self.sslmode or (IAM_SSLMODE if self.iam_auth else None)

    @property
    def complete(self) -> bool:
        """Whether the settings alone say where to log in (IAM auth needs no secret)."""
        return self.iam_auth and bool(self.host and self.user)

    def missing_without_secret(self) -> list[str]:
        """What IAM auth with neither a URL nor a secret still needs."""
        needed = [(variables.DATABASE_HOST, self.host), (variables.DATABASE_USER, self.user)]
        return [setting.name for setting, value in needed if not value]

    def over_url(self, url: str) -> str:
        """DULY_DATABASE_URL as given, with the sslmode if one is wanted and it names none."""
        parsed = make_url(url)
        if self.ssl is None or "sslmode" in parsed.query:
            return url
        return parsed.update_query_dict({"sslmode": self.ssl}).render_as_string(hide_password=False)

    def url(self, secret: Mapping[str, Any] | None = None) -> str:
        """The psycopg URL of the secret's fields (if any) under these settings, the password
        quoted; a ConfigurationError naming every field missing from both."""
        fields = secret or {}
        host = self.host or _text(fields.get("host"))
        user = self.user or _text(fields.get("username"))
        password = None if self.iam_auth else _text(fields.get("password"))
        missing = [
            name
            for name, value in (("host", host), ("username", user), ("password", password))
            if not value and not (name == "password" and self.iam_auth)
        ]
        if missing:
            raise ConfigurationError(_missing_sentence(missing, secret is not None))
        assert host is not None and user is not None
        port = self.port or _port_of(fields.get("port"))
        # A unix socket's directory (a self-managed secret, a test) goes in the query, where
        # libpq reads it.
        socket = host.startswith("/")
        query = {"host": host, "port": str(port)} if socket else {}
        if self.ssl is not None:
            query["sslmode"] = self.ssl
        url = URL.create(
            DRIVER,
            username=user,
            password=password,
            host=None if socket else host,
            port=None if socket else port,
            database=self.name or _text(fields.get("dbname")) or DEFAULT_DBNAME,
            query=query,
        )
        return url.render_as_string(hide_password=False)


def secret_fields(secret_string: str) -> dict[str, Any]:
    """A database secret's JSON object; refused if it is not one, or is not PostgreSQL's."""
    try:
        secret = json.loads(secret_string)
    except ValueError:
        raise ConfigurationError("The database secret is not JSON.") from None
    if not isinstance(secret, dict):
        raise ConfigurationError("The database secret is not a JSON object.")
    engine = secret.get("engine")
    if engine is not None and str(engine).lower() not in POSTGRES_ENGINES:
        raise ConfigurationError(
            f"The database secret is for {str(engine)[:40]!r}, not PostgreSQL: its engine "
            f"must be one of {', '.join(sorted(POSTGRES_ENGINES))}."
        )
    return secret


def _missing_sentence(missing: list[str], from_secret: bool) -> str:
    where = "The database secret has no " if from_secret else "The database login has no "
    sentence = where + ", ".join(missing)
    if "host" in missing:
        sentence += f", and {variables.DATABASE_HOST.name} is unset: {HOST_HINT}"
    others = [name for name in missing if name != "host"]
    if others:
        sentence += (
            "; it needs username and password (or "
            f"{variables.DATABASE_USER.name} with {variables.DATABASE_IAM_AUTH.name}, for a "
            "token in place of the password)"
        )
    return sentence + "."


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def _port_of(value: object) -> int:
    if value in (None, ""):
        return DEFAULT_PORT
    try:
        return int(str(value))
    except ValueError:
        sentence = f"The database secret's port is not a number: {value!r}."
        raise ConfigurationError(sentence) from None
