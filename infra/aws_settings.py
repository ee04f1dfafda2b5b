"""The AWS functions' settings: `AwsSettings.from_env`, read at cold start.

The variables are declared in `engine.base.settings`: the database
(DULY_DATABASE_URL, else DULY_DATABASE_SECRET_ARN's Secrets Manager secret),
the wake function and its schedule (DULY_WAKE_FUNCTION_ARN,
DULY_SCHEDULE_GROUP, DULY_SCHEDULER_ROLE_ARN), DULY_APP, and the wakes'
bounds (DULY_MAX_WAKES, DULY_WAKE_MARGIN_SECONDS). Everything is checked at
once: a misconfigured deployment fails its first invocation with one
`ConfigurationError` naming every variable to fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import URL

from engine.base import settings as variables
from engine.base.errors import ConfigurationError
from infra.settings import DEFAULT_APP, DRIVER, database_url

DEFAULT_MAX_WAKES = variables.MAX_WAKES.default
DEFAULT_WAKE_MARGIN_SECONDS = variables.WAKE_MARGIN_SECONDS.default
DEFAULT_PORT = 5432
DEFAULT_DBNAME = "postgres"  # what RDS connects to when the secret names no database
T = TypeVar("T")
REQUIRED = (variables.WAKE_FUNCTION_ARN, variables.SCHEDULE_GROUP, variables.SCHEDULER_ROLE_ARN)


@dataclass(frozen=True)
class AwsSettings:
    """Where the database is, what the scheduler targets, and how wake invocations are bounded."""

    database_url: str | None  # None: read it from database_secret_arn
    database_secret_arn: str | None
    wake_function_arn: str
    schedule_group: str
    scheduler_role_arn: str
    app_module: str = DEFAULT_APP
    max_wakes: int = DEFAULT_MAX_WAKES
    wake_margin_seconds: float = DEFAULT_WAKE_MARGIN_SECONDS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AwsSettings:
        """Read the variables; every missing or bad one is named in one ConfigurationError."""
        problems: list[str] = []

        def read(setting: variables.Setting[T]) -> T:
            try:
                return setting.read(environ)
            except ConfigurationError as error:
                problems.append(str(error).rstrip("."))
                return setting.default

        url = read(variables.DATABASE_URL)
        secret = read(variables.DATABASE_SECRET_ARN)
        either = f"{variables.DATABASE_URL.name} or {variables.DATABASE_SECRET_ARN.name}"
        missing = [] if url or secret else [either]
        missing += [setting.name for setting in REQUIRED if read(setting) is None]
        if missing:
            problems.append("missing " + ", ".join(missing))
        try:
            url = database_url(url)
        except ConfigurationError as error:
            problems.append(str(error).rstrip("."))
        max_wakes = read(variables.MAX_WAKES)
        margin = read(variables.WAKE_MARGIN_SECONDS)
        if problems:
            raise ConfigurationError(
                "duly's AWS functions cannot start: " + "; ".join(problems) + "."
            )
        return cls(
            database_url=url,
            database_secret_arn=secret,
            wake_function_arn=read(variables.WAKE_FUNCTION_ARN) or "",
            schedule_group=read(variables.SCHEDULE_GROUP) or "",
            scheduler_role_arn=read(variables.SCHEDULER_ROLE_ARN) or "",
            app_module=read(variables.APP),
            max_wakes=max_wakes,
            wake_margin_seconds=margin,
        )


def database_url_from_secret(secret_string: str) -> str:
    """A psycopg URL from a Secrets Manager secret's JSON, the password quoted."""
    try:
        secret = json.loads(secret_string)
    except ValueError:
        raise ConfigurationError("The database secret is not JSON.") from None
    if not isinstance(secret, dict):
        raise ConfigurationError("The database secret is not a JSON object.")
    missing = [key for key in ("host", "username", "password") if not secret.get(key)]
    if missing:
        raise ConfigurationError(
            "The database secret has no " + ", ".join(missing) + ": it needs host, username "
            "and password (port and dbname are optional), as RDS writes them."
        )
    try:
        port = int(secret.get("port") or DEFAULT_PORT)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"The database secret's port is not a number: {secret['port']!r}."
        ) from None
    host = str(secret["host"])
    # A unix socket's directory (a self-managed secret, a test) goes in the query, where
    # libpq reads it.
    socket = host.startswith("/")
    url = URL.create(
        DRIVER,
        username=str(secret["username"]),
        password=str(secret["password"]),
        host=None if socket else host,
        port=None if socket else port,
        database=str(secret.get("dbname") or DEFAULT_DBNAME),
        query={"host": host, "port": str(port)} if socket else {},
    )
    return url.render_as_string(hide_password=False)


def resolve_database_url(settings: AwsSettings, secrets_client: Any | Callable[[], Any]) -> str:
    """DULY_DATABASE_URL, else the secret's URL. `secrets_client` is a boto3 `secretsmanager`
    client or a factory for one, called only when the secret is read (a client is not
    callable), so a deployment with a URL never creates one."""
    if settings.database_url is not None:
        return settings.database_url
    assert settings.database_secret_arn is not None  # from_env requires one of the two
    client = secrets_client() if callable(secrets_client) else secrets_client
    response = client.get_secret_value(SecretId=settings.database_secret_arn)
    secret = response.get("SecretString")
    if not isinstance(secret, str):
        raise ConfigurationError(
            f"The secret {settings.database_secret_arn} holds no SecretString: store the "
            "database connection as JSON text."
        )
    return database_url_from_secret(secret)
