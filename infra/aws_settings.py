"""The AWS functions' settings, read from the environment at cold start.

DULY_DATABASE_URL         the workflow database; wins over the secret when both are set
DULY_DATABASE_SECRET_ARN  else: a Secrets Manager secret as RDS writes it (host, port,
                          username, password, dbname)
DULY_WAKE_FUNCTION_ARN    the wake function: the schedule's target, and what a kick invokes
DULY_SCHEDULE_GROUP       the EventBridge Scheduler group of the deployment's schedule
DULY_SCHEDULER_ROLE_ARN   the role the scheduler assumes to invoke the wake function
DULY_APP                  the module that maps the workflows (default functions.examples)
DULY_MAX_WAKES            at most this many wake invocations at once (default 4, >= 1):
                          match the wake function's reserved concurrency
DULY_WAKE_MARGIN_SECONDS  a wake stops claiming this long before its deadline (default 10,
                          >= 1)

Everything is checked at once, so a misconfigured deployment fails its first
invocation with one `ConfigurationError` naming every variable to fix, rather
than one per deploy.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from engine.errors import ConfigurationError
from infra.settings import DEFAULT_APP, DRIVER, database_url

DEFAULT_MAX_WAKES = 4
DEFAULT_WAKE_MARGIN_SECONDS = 10.0
DEFAULT_PORT = 5432
DEFAULT_DBNAME = "postgres"  # what RDS connects to when the secret names no database
REQUIRED = ("DULY_WAKE_FUNCTION_ARN", "DULY_SCHEDULE_GROUP", "DULY_SCHEDULER_ROLE_ARN")


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
        env = os.environ if environ is None else environ

        def get(variable: str) -> str | None:
            return env.get(variable, "").strip() or None

        problems: list[str] = []
        url = get("DULY_DATABASE_URL")
        secret = get("DULY_DATABASE_SECRET_ARN")
        missing = [] if url or secret else ["DULY_DATABASE_URL or DULY_DATABASE_SECRET_ARN"]
        missing += [variable for variable in REQUIRED if get(variable) is None]
        if missing:
            problems.append("missing " + ", ".join(missing))
        try:
            url = database_url(url)
        except ValueError as error:
            problems.append(str(error).rstrip("."))
        max_wakes = _number(get("DULY_MAX_WAKES"), "DULY_MAX_WAKES", DEFAULT_MAX_WAKES, problems)
        margin = _number(
            get("DULY_WAKE_MARGIN_SECONDS"),
            "DULY_WAKE_MARGIN_SECONDS",
            DEFAULT_WAKE_MARGIN_SECONDS,
            problems,
        )
        if problems:
            raise ConfigurationError(
                "duly's AWS functions cannot start: " + "; ".join(problems) + "."
            )
        return cls(
            database_url=url,
            database_secret_arn=secret,
            wake_function_arn=get("DULY_WAKE_FUNCTION_ARN") or "",
            schedule_group=get("DULY_SCHEDULE_GROUP") or "",
            scheduler_role_arn=get("DULY_SCHEDULER_ROLE_ARN") or "",
            app_module=get("DULY_APP") or DEFAULT_APP,
            max_wakes=int(max_wakes),
            wake_margin_seconds=float(margin),
        )


def _number(value: str | None, variable: str, default: float, problems: list[str]) -> float:
    """`value` as a number >= 1 (whole when `default` is), or `default`; else a problem."""
    if value is None:
        return default
    whole = isinstance(default, int)
    try:
        number = int(value) if whole else float(value)
    except ValueError:
        kind = "a whole number" if whole else "a number of seconds"
        problems.append(f"{variable} must be {kind}, not {value!r}")
        return default
    if not (number >= 1 and math.isfinite(number)):  # also refuses NaN and inf
        problems.append(f"{variable} must be at least 1, not {value!r}")
    return number


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
