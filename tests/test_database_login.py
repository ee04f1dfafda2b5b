"""The AWS functions' database login (infra/aws/database_login.py, infra/aws/iam_auth.py).

Against the suite's real PostgreSQL, with roles whose password it checks
(tests/password_login.py), Secrets Manager on moto:

- an RDS-managed master user secret (username and password only) logs in,
  the host, port and name from DULY_DATABASE_HOST, _PORT and _NAME; a wrong
  password is refused, so the password really came from the secret
  (test_an_rds_managed_secret_logs_in_with_the_host_from_the_settings)
- without DULY_DATABASE_HOST it is refused naming the field and the setting,
  never the password (test_a_secret_without_a_host_names_what_is_missing)
- the settings win over a generic secret's fields (an RDS Proxy's endpoint),
  and a secret of another engine is refused
  (test_the_settings_win_over_a_generic_secret, test_a_secret_of_another_engine_is_refused)
- IAM auth: the Lambda runtime logs in with boto3's generate_db_auth_token,
  a token per new connection, the server set to take it as the password
  (test_the_lambda_runtime_logs_in_with_a_fresh_iam_token_per_connection)
- an RDS-managed secret whose host is PgBouncer in transaction mode, as RDS
  Proxy stands: publish and wake work through it
  (test_publish_and_wake_through_pgbouncer_with_an_rds_managed_secret)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from engine import ConfigurationError
from functions.lambdas import handlers as lambda_handlers
from functions.lambdas.runtime import WAKE_INPUT, Runtime, install
from infra.aws.database_login import DatabaseLogin
from infra.aws.settings import AwsSettings, database_url_from_secret, resolve_database_url
from infra.testing.pytest_plugin import Database, Server
from tests.apps.serverless_app import SIGNUP
from tests.aws_fakes import (
    AWKWARD_PASSWORD,
    PROD_ENV,
    Aws,
    Context,
    aws_client,
    create_tables,
    function,
    one_signup,
    quiet_scheduler,
    settings_for,
)
from tests.password_login import Socket, logs_in, password_role, set_password, tcp_port
from tests.pgbouncer import Bouncer, start_pgbouncer

LOOPBACK = "127.0.0.1"
PROXY_HOST = "duly-proxy.proxy-abc.us-east-1.rds.amazonaws.com"
LAMBDA_APPLICATION = "duly-lambda"  # the runtime's application_name

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")


@pytest.fixture
def secrets(moto_endpoint: str) -> Any:
    """A Secrets Manager client on moto, no secret stored yet."""
    return aws_client(moto_endpoint, "secretsmanager")


def rds_managed_secret(username: str, password: str) -> str:
    """A master user secret as RDS manages it: username and password, nothing else."""
    return json.dumps({"username": username, "password": password})


def where(db: Database) -> dict[str, str]:
    """DULY_DATABASE_HOST, _PORT and _NAME of the test's database."""
    socket = Socket.of(db)
    return {
        "DULY_DATABASE_HOST": socket.directory,
        "DULY_DATABASE_PORT": str(socket.port),
        "DULY_DATABASE_NAME": db.name,
    }


# -- secrets ----------------------------------------------------------------------------------


async def test_an_rds_managed_secret_logs_in_with_the_host_from_the_settings(
    db: Database, server: Server, secrets: Any
) -> None:
    async with password_role(db, server, AWKWARD_PASSWORD) as role:
        arn = secrets.create_secret(
            Name="rds!db-1", SecretString=rds_managed_secret(role, AWKWARD_PASSWORD)
        )["ARN"]
        settings = AwsSettings.from_env(PROD_ENV | where(db) | {"DULY_DATABASE_SECRET_ARN": arn})
        url = resolve_database_url(settings, secrets)
        assert make_url(url).password == AWKWARD_PASSWORD
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT current_user")) == role
                assert await conn.scalar(text("SELECT current_database()")) == db.name
        finally:
            await engine.dispose()

        wrong = secrets.create_secret(
            Name="rds!db-2", SecretString=rds_managed_secret(role, "not the password")
        )["ARN"]
        settings = AwsSettings.from_env(PROD_ENV | where(db) | {"DULY_DATABASE_SECRET_ARN": wrong})
        engine = create_async_engine(resolve_database_url(settings, secrets))
        try:
            with pytest.raises(Exception, match="password authentication failed"):
                async with engine.connect():
                    pass
        finally:
            await engine.dispose()


def test_a_secret_without_a_host_names_what_is_missing() -> None:
    with pytest.raises(ConfigurationError) as caught:
        database_url_from_secret(rds_managed_secret("duly_app", AWKWARD_PASSWORD))
    message = str(caught.value)
    assert "has no host, and DULY_DATABASE_HOST is unset" in message
    assert "RDS-managed master user secret" in message
    assert AWKWARD_PASSWORD not in message and "duly_app" not in message

    with pytest.raises(ConfigurationError) as caught:
        database_url_from_secret(json.dumps({"username": "u"}), DatabaseLogin(host="h"))
    assert "has no password" in str(caught.value)
    assert "DULY_DATABASE_IAM_AUTH" in str(caught.value)

    # With IAM auth no password is needed: the token takes its place.
    url = make_url(database_url_from_secret("{}", DatabaseLogin(host="h", user="u", iam_auth=True)))
    assert (url.username, url.password, url.query["sslmode"]) == ("u", None, "require")


def test_the_settings_win_over_a_generic_secret() -> None:
    generic = {
        "engine": "postgres",
        "host": "duly.cluster-abc.us-east-1.rds.amazonaws.com",
        "port": 5432,
        "username": "duly_app",
        "password": AWKWARD_PASSWORD,
        "dbname": "duly",
    }
    login = DatabaseLogin(host=PROXY_HOST, port=6432, sslmode="verify-full")
    url = make_url(database_url_from_secret(json.dumps(generic), login))
    assert (url.host, url.port, url.database, url.username) == (
        PROXY_HOST,
        6432,
        "duly",
        "duly_app",
    )
    assert (url.password, url.query["sslmode"]) == (AWKWARD_PASSWORD, "verify-full")
    unchanged = make_url(database_url_from_secret(json.dumps(generic)))
    assert (unchanged.host, unchanged.port) == (generic["host"], 5432)
    assert "sslmode" not in unchanged.query


def test_a_secret_of_another_engine_is_refused() -> None:
    secret = json.dumps({"engine": "mysql", "host": "h", "username": "u", "password": "p"})
    with pytest.raises(ConfigurationError, match="is for 'mysql', not PostgreSQL"):
        database_url_from_secret(secret)


def test_iam_auth_with_neither_url_nor_secret_needs_the_host_and_user() -> None:
    bare = {k: v for k, v in PROD_ENV.items() if k != "DULY_DATABASE_SECRET_ARN"}
    with pytest.raises(ConfigurationError) as caught:
        AwsSettings.from_env(bare | {"DULY_DATABASE_IAM_AUTH": "on", "DULY_DATABASE_HOST": "h"})
    assert "(or, with IAM auth, DULY_DATABASE_USER)" in str(caught.value)
    settings = AwsSettings.from_env(
        bare
        | {"DULY_DATABASE_IAM_AUTH": "on", "DULY_DATABASE_HOST": "h", "DULY_DATABASE_USER": "u"}
    )
    assert settings.database == DatabaseLogin(host="h", user="u", iam_auth=True)
    with pytest.raises(ConfigurationError, match="DULY_DATABASE_SSLMODE must be one of"):
        AwsSettings.from_env(PROD_ENV | {"DULY_DATABASE_SSLMODE": "always"})


# -- IAM database authentication ------------------------------------------------------------


class TokensTheServerTakes:
    """boto3's rds client, signing tokens as it does; each token it signs is made the role's
    password just before the connection presents it, as RDS would accept it."""

    def __init__(self, client: Any, db: Database, role: str) -> None:
        self.client = client
        self.db = db
        self.role = role
        self.signed: list[tuple[dict[str, Any], str]] = []

    def generate_db_auth_token(self, **request: Any) -> str:
        token: str = self.client.generate_db_auth_token(**request)
        set_password(self.db, self.role, token)
        self.signed.append((request, token))
        return token


async def test_the_lambda_runtime_logs_in_with_a_fresh_iam_token_per_connection(
    db: Database, server: Server, moto_endpoint: str
) -> None:
    Session = await create_tables(db)
    async with (
        password_role(db, server, "no token yet", superuser=True) as role,
        tcp_port(db) as port,
    ):
        rds = TokensTheServerTakes(aws_client(moto_endpoint, "rds"), db, role)
        # The test server has no TLS: sslmode (require by default with IAM auth) says so.
        login = DatabaseLogin(
            host=LOOPBACK, port=port, name=db.name, user=role, iam_auth=True, sslmode="disable"
        )
        settings = dataclasses.replace(settings_for(db), database_url=None, database=login)
        runtime = Runtime(
            settings,
            scheduler=quiet_scheduler,
            invoke=_no_wake,
            clients=lambda service: rds if service == "rds" else None,
        )
        with ThreadPoolExecutor(1) as container_thread:  # one thread, as a Lambda container
            opened, signed = await asyncio.get_running_loop().run_in_executor(
                container_thread, serve_a_signup, runtime, rds
            )
        assert (await one_signup(Session)).status == "welcomed"
        assert opened >= 1, "the pool opened connections it did not have"
        assert signed == opened, "one token per new connection"

    request, token = rds.signed[-1]
    assert request == {"DBHostname": LOOPBACK, "Port": port, "DBUsername": role}
    assert token.startswith(f"{LOOPBACK}:{port}/?Action=connect&DBUser={role}")
    assert "X-Amz-Signature=" in token and "X-Amz-Expires=900" in token


async def test_a_token_the_server_does_not_hold_is_refused(db: Database, server: Server) -> None:
    """The check above means something: a token is a password the server really checks."""
    async with password_role(db, server, "the password") as role:
        assert logs_in(db, role, "the password")
        assert not logs_in(db, role, "an old token")


async def _no_wake() -> None:
    return None


def serve_a_signup(runtime: Runtime, rds: TokensTheServerTakes) -> tuple[int, int]:
    """Publish and wake through `runtime` as Lambda calls them; then three connections at once
    on its engine: how many the pool opened, and how many tokens were signed meanwhile."""
    install(runtime)
    try:
        event_ = {"event_type": SIGNUP, "event_id": "i-1", "payload": {"email": "a@ex.com"}}
        assert lambda_handlers.publish(event_, Context(30.0))["stored"] == ["i-1"]
        woken = lambda_handlers.wake(WAKE_INPUT, Context(30.0))
        assert woken["caught_up"], woken
        container = runtime.run(runtime.container())
        opened: list[object] = []
        event.listen(container.engine.sync_engine, "connect", lambda *_: opened.append(1))
        before = len(rds.signed)
        runtime.run(connections_at_once(container.engine, rds.role, 3))
        return len(opened), len(rds.signed) - before
    finally:
        runtime.close()


async def connections_at_once(engine: Any, role: str, count: int) -> None:
    """`count` connections held together, each logged in as `role`."""
    held = asyncio.Barrier(count)

    async def one() -> None:
        async with engine.connect() as conn:
            assert await conn.scalar(text("SELECT current_user")) == role
            await held.wait()  # all of them open at once: the pool must open more

    await asyncio.gather(*(one() for _ in range(count)))


# -- through a pooler, as RDS Proxy stands --------------------------------------------------


@pytest.fixture
def bouncer(db: Database, server: Server) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode in front of this test's database."""
    with start_pgbouncer(db, server) as running:
        yield running


async def test_publish_and_wake_through_pgbouncer_with_an_rds_managed_secret(
    bouncer: Bouncer, db: Database, moto_endpoint: str
) -> None:
    Session = await create_tables(db)
    aws = Aws(moto_endpoint)
    secret = rds_managed_secret(bouncer.user, "PgBouncer trusts this test")
    arn = aws.client("secretsmanager").create_secret(Name="rds!db", SecretString=secret)["ARN"]
    env = PROD_ENV | {
        "DULY_DATABASE_SECRET_ARN": arn,
        "DULY_DATABASE_HOST": "127.0.0.1",
        "DULY_DATABASE_PORT": str(bouncer.port),
        "DULY_DATABASE_NAME": db.name,
    }
    from_env = AwsSettings.from_env(env)
    settings = dataclasses.replace(
        settings_for(db, aws.group),
        database_url=None,
        database_secret_arn=arn,
        database=from_env.database,
    )
    async with function(settings, aws=aws) as fn:
        event_ = {"event_type": SIGNUP, "event_id": "b-1", "payload": {"email": "b@ex.com"}}
        published = await fn.call(lambda_handlers.publish, event_)
        assert published["stored"] == ["b-1"]
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
        assert (woken["steps"], woken["caught_up"]) == (2, True), woken
        clients = [
            c for c in bouncer.show("CLIENTS") if c["application_name"] == LAMBDA_APPLICATION
        ]
        assert clients, "the runtime connected through PgBouncer, as the secret and settings say"
    assert (await one_signup(Session)).status == "welcomed"
