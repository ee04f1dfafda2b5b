"""The AWS functions' settings (infra/aws/settings.py), with Secrets Manager on moto.

The rules, and the tests that hold them:

- every variable is read, blanks count as unset, and the defaults are
  functions.examples, 4 wakes and a 10 s margin
  (test_every_variable_is_read, test_defaults_and_blanks,
  test_from_env_reads_the_process_environment)
- DULY_DATABASE_URL or DULY_DATABASE_SECRET_ARN is required, and the URL gets
  psycopg's driver (test_a_url_or_a_secret_is_enough,
  test_a_bad_database_url_is_named)
- every missing or bad variable is named in one ConfigurationError
  (test_every_missing_variable_is_named_in_one_message,
  test_bad_numbers_are_named)
- a secret as RDS writes it becomes a psycopg URL, the password quoted, port
  and dbname defaulted; a bad secret says what is wrong
  (test_a_secret_becomes_a_url_with_the_password_quoted,
  test_port_and_dbname_have_defaults, test_a_bad_secret_is_refused_saying_why,
  test_the_secrets_url_connects_to_postgres)
- resolve_database_url: the URL wins and the secrets client is never made;
  else the secret is read from Secrets Manager
  (test_the_url_wins_and_no_secrets_client_is_made,
  test_the_secret_is_read_from_secrets_manager,
  test_a_binary_secret_is_refused)
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import boto3
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from engine import ConfigurationError
from infra.aws.settings import AwsSettings, database_url_from_secret, resolve_database_url
from tests.aws_fakes import (
    AWKWARD_PASSWORD,
    PROD_ENV as ENV,
    PROD_ROLE_ARN as ROLE_ARN,
    PROD_SECRET_ARN as SECRET_ARN,
    PROD_WAKE_ARN as WAKE_ARN,
)
from tests.conftest import Database


@pytest.fixture
def secrets(moto_endpoint: str) -> Any:
    """A Secrets Manager client on moto, no secret stored yet."""
    return boto3.client(
        "secretsmanager",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_every_variable_is_read() -> None:
    settings = AwsSettings.from_env(
        ENV
        | {
            "DULY_DATABASE_URL": "postgresql://u:p@db.internal:6432/app",
            "DULY_APP": "myapp.workflows",
            "DULY_MAX_WAKES": "16",
            "DULY_WAKE_MARGIN_SECONDS": "2.5",
        }
    )
    assert settings == AwsSettings(
        database_url="postgresql+psycopg://u:p@db.internal:6432/app",
        database_secret_arn=SECRET_ARN,
        wake_function_arn=WAKE_ARN,
        schedule_group="duly-prod",
        scheduler_role_arn=ROLE_ARN,
        app_module="myapp.workflows",
        max_wakes=16,
        wake_margin_seconds=2.5,
    )


def test_defaults_and_blanks() -> None:
    settings = AwsSettings.from_env(
        ENV | {"DULY_APP": " ", "DULY_MAX_WAKES": "", "DULY_DATABASE_URL": "  "}
    )
    assert settings.database_url is None
    assert settings.app_module == "functions.examples"
    assert settings.max_wakes == 4
    assert settings.wake_margin_seconds == 10


def test_from_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in ENV.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("DULY_DATABASE_URL", raising=False)
    monkeypatch.setenv("DULY_MAX_WAKES", "2")
    settings = AwsSettings.from_env()
    assert (settings.database_secret_arn, settings.max_wakes) == (SECRET_ARN, 2)


def test_a_url_or_a_secret_is_enough() -> None:
    without_secret = {k: v for k, v in ENV.items() if k != "DULY_DATABASE_SECRET_ARN"}
    settings = AwsSettings.from_env(without_secret | {"DULY_DATABASE_URL": "postgres://h/d"})
    assert settings.database_url == "postgresql+psycopg://h/d"
    assert settings.database_secret_arn is None
    assert AwsSettings.from_env(ENV).database_secret_arn == SECRET_ARN


def test_every_missing_variable_is_named_in_one_message() -> None:
    with pytest.raises(ConfigurationError) as caught:
        AwsSettings.from_env({"DULY_SCHEDULE_GROUP": "g", "DULY_MAX_WAKES": "none"})
    message = str(caught.value)
    for variable in (
        "DULY_DATABASE_URL or DULY_DATABASE_SECRET_ARN",
        "DULY_WAKE_FUNCTION_ARN",
        "DULY_SCHEDULER_ROLE_ARN",
        "DULY_MAX_WAKES must be a whole number, not 'none'",
    ):
        assert variable in message
    assert "DULY_SCHEDULE_GROUP" not in message
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DULY_MAX_WAKES", "0", "DULY_MAX_WAKES must be at least 1, not 0"),
        ("DULY_MAX_WAKES", "2.5", "DULY_MAX_WAKES must be a whole number"),
        ("DULY_WAKE_MARGIN_SECONDS", "0.5", "DULY_WAKE_MARGIN_SECONDS must be at least 1"),
        ("DULY_WAKE_MARGIN_SECONDS", "nan", "DULY_WAKE_MARGIN_SECONDS must be at least 1"),
        ("DULY_WAKE_MARGIN_SECONDS", "inf", "DULY_WAKE_MARGIN_SECONDS must be at least 1"),
        ("DULY_WAKE_MARGIN_SECONDS", "soon", "DULY_WAKE_MARGIN_SECONDS must be a number"),
    ],
)
def test_bad_numbers_are_named(variable: str, value: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        AwsSettings.from_env(ENV | {variable: value})


def test_a_bad_database_url_is_named() -> None:
    with pytest.raises(ConfigurationError, match="DULY_DATABASE_URL uses mysql://"):
        AwsSettings.from_env(ENV | {"DULY_DATABASE_URL": "mysql://u@h/d"})


def rds_secret(**overrides: object) -> str:
    """A secret as RDS's 'credentials for an RDS database' writes it."""
    secret: dict[str, object] = {
        "engine": "postgres",
        "host": "duly.cluster-abc.us-east-1.rds.amazonaws.com",
        "port": 5432,
        "username": "duly_app",
        "password": AWKWARD_PASSWORD,
        "dbname": "duly",
    }
    return json.dumps(secret | overrides)


def test_a_secret_becomes_a_url_with_the_password_quoted() -> None:
    url = database_url_from_secret(rds_secret(port="6543"))
    assert url.startswith("postgresql+psycopg://duly_app:")
    assert AWKWARD_PASSWORD not in url, "quoted, not written as is"
    parsed = make_url(url)
    assert parsed.password == AWKWARD_PASSWORD
    assert (parsed.username, parsed.host, parsed.port, parsed.database) == (
        "duly_app",
        "duly.cluster-abc.us-east-1.rds.amazonaws.com",
        6543,
        "duly",
    )


def test_port_and_dbname_have_defaults() -> None:
    secret = json.dumps({"host": "h", "username": "u", "password": "p"})
    parsed = make_url(database_url_from_secret(secret))
    assert (parsed.port, parsed.database) == (5432, "postgres")


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"host": "h"}), "has no username, password"),
        (rds_secret(port="fifty"), "port is not a number: 'fifty'"),
    ],
)
def test_a_bad_secret_is_refused_saying_why(secret: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        database_url_from_secret(secret)


async def test_the_secrets_url_connects_to_postgres(db: Database) -> None:
    """A role with an awkward name and password, reached through the URL the secret makes."""
    role = f"duly secret {uuid.uuid4().hex[:8]}"
    escaped = AWKWARD_PASSWORD.replace("'", "''")
    db.sql(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{escaped}'")
    try:
        server = make_url(db.url)  # the embedded server is behind a unix socket
        secret = json.dumps(
            {
                "host": server.host or server.query["host"],
                "port": server.port or int(str(server.query.get("port", 5432))),
                "username": role,
                "password": AWKWARD_PASSWORD,
                "dbname": db.name,
            }
        )
        engine = create_async_engine(database_url_from_secret(secret))
        try:
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT current_user")) == role
                assert await conn.scalar(text("SELECT current_database()")) == db.name
        finally:
            await engine.dispose()
    finally:
        db.sql(f'DROP ROLE "{role}"')


def test_the_url_wins_and_no_secrets_client_is_made() -> None:
    settings = AwsSettings.from_env(ENV | {"DULY_DATABASE_URL": "postgresql://u@h/d"})

    def no_client() -> Any:
        raise AssertionError("the secrets client was made")

    assert resolve_database_url(settings, no_client) == "postgresql+psycopg://u@h/d"


def test_the_secret_is_read_from_secrets_manager(secrets: Any) -> None:
    arn = secrets.create_secret(Name="duly-db", SecretString=rds_secret())["ARN"]
    settings = AwsSettings.from_env(ENV | {"DULY_DATABASE_SECRET_ARN": arn})
    made: list[Any] = []

    def factory() -> Any:
        made.append(secrets)
        return secrets

    url = resolve_database_url(settings, factory)
    assert url == database_url_from_secret(rds_secret())
    assert make_url(url).password == AWKWARD_PASSWORD
    assert len(made) == 1
    assert resolve_database_url(settings, secrets) == url, "a client is used as it is"


def test_a_binary_secret_is_refused(secrets: Any) -> None:
    arn = secrets.create_secret(Name="duly-db", SecretBinary=b"\x00\x01")["ARN"]
    settings = AwsSettings.from_env(ENV | {"DULY_DATABASE_SECRET_ARN": arn})
    with pytest.raises(ConfigurationError, match="holds no SecretString"):
        resolve_database_url(settings, secrets)
