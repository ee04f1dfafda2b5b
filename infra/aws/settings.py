"""The AWS functions' settings: `AwsSettings.from_env`, read at cold start.

The variables are declared in `engine.base.settings`: the database
(DULY_DATABASE_URL, else DULY_DATABASE_SECRET_ARN's Secrets Manager secret, under
`infra.aws.database_login`'s settings, and whether it pauses: DULY_DATABASE_PAUSES),
the wake function and its schedule (DULY_WAKE_FUNCTION_ARN,
DULY_SCHEDULE_GROUP, DULY_SCHEDULER_ROLE_ARN), DULY_APP, and the wakes'
bounds (DULY_MAX_WAKES, DULY_WAKE_MARGIN_SECONDS). Everything is checked at
once: a misconfigured deployment fails its first invocation with one
`ConfigurationError` naming every variable to fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine import ConfigurationError, settings as variables
from infra.aws.database_login import DatabaseLogin, secret_fields
from infra.settings import DEFAULT_APP, database_url

DEFAULT_MAX_WAKES = variables.MAX_WAKES.default
DEFAULT_WAKE_MARGIN_SECONDS = variables.WAKE_MARGIN_SECONDS.default
DEFAULT_SECRET_MAX_AGE = variables.DATABASE_SECRET_MAX_AGE_SECONDS.default
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
    database: DatabaseLogin = field(default_factory=DatabaseLogin)  # over the secret's fields
    secret_max_age: float = DEFAULT_SECRET_MAX_AGE  # seconds a warm copy of the secret is kept
    database_pauses: bool = False  # release connections after each invocation, wait for resumes

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
        login = DatabaseLogin(
            host=read(variables.DATABASE_HOST),
            port=read(variables.DATABASE_PORT),
            name=read(variables.DATABASE_NAME),
            user=read(variables.DATABASE_USER),
            iam_auth=read(variables.DATABASE_IAM_AUTH),
            sslmode=read(variables.DATABASE_SSLMODE),
        )
        missing = [] if url or secret or login.complete else [_either(login)]
        missing += [setting.name for setting in REQUIRED if read(setting) is None]
        if missing:
            problems.append("missing " + ", ".join(missing))
        try:
            url = database_url(url)
        except ConfigurationError as error:
            problems.append(str(error).rstrip("."))
        max_wakes = read(variables.MAX_WAKES)
        margin = read(variables.WAKE_MARGIN_SECONDS)
        secret_max_age = read(variables.DATABASE_SECRET_MAX_AGE_SECONDS)
        pauses = read(variables.DATABASE_PAUSES)
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
            database=login,
            secret_max_age=secret_max_age,
            database_pauses=pauses,
        )


def _either(login: DatabaseLogin) -> str:
    either = f"{variables.DATABASE_URL.name} or {variables.DATABASE_SECRET_ARN.name}"
    if login.iam_auth:
        return f"{either} (or, with IAM auth, {' and '.join(login.missing_without_secret())})"
    return either


def database_url_from_secret(secret_string: str, login: DatabaseLogin | None = None) -> str:
    """A psycopg URL from a Secrets Manager secret's JSON under the database settings (none
    given: the secret alone), the password quoted."""
    return (login or DatabaseLogin()).url(secret_fields(secret_string))


def read_secret_string(settings: AwsSettings, client: Any) -> str:
    """The SecretString of DULY_DATABASE_SECRET_ARN's secret (a ConfigurationError if none)."""
    response = client.get_secret_value(SecretId=settings.database_secret_arn)
    secret = response.get("SecretString")
    if not isinstance(secret, str):
        raise ConfigurationError(
            f"The secret {settings.database_secret_arn} holds no SecretString: store the "
            "database connection as JSON text."
        )
    return secret


def resolve_database_url(settings: AwsSettings, secrets_client: Any | Callable[[], Any]) -> str:
    """DULY_DATABASE_URL, else the secret's URL, else the settings' (IAM auth). `secrets_client`
    is a boto3 `secretsmanager` client or a factory for one, called only when the secret is
    read (a client is not callable), so a deployment with a URL never creates one."""
    login = settings.database
    if settings.database_url is not None:
        return login.over_url(database_url(settings.database_url) or settings.database_url)
    if settings.database_secret_arn is None:
        return login.url()  # IAM auth, the settings saying where (from_env checked them)
    client = secrets_client() if callable(secrets_client) else secrets_client
    return database_url_from_secret(read_secret_string(settings, client), login)
