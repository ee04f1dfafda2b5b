"""A database password rotated under a warm Lambda container (infra/aws/secret_login.py).

Against the suite's real PostgreSQL, a role whose password it checks
(tests/password_login.py), the secret on moto's Secrets Manager:

- the password is changed (ALTER ROLE) and the secret updated, as Secrets
  Manager's rotation does, while a container is warm: its next invocation
  connects, the refused login read the secret again once, and the log names
  no password (test_a_rotated_password_is_picked_up_by_the_next_invocation)
- a copy older than the bound is read again before it is refused
  (test_a_copy_older_than_the_bound_is_read_again)
- a refusal that is no login's is raised, not retried
  (test_another_failure_to_connect_is_not_taken_for_a_rotation)
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from functions.lambdas import handlers as lambda_handlers
from infra.aws.database_login import DatabaseLogin
from infra.aws.secret_login import RotatingSecret
from infra.aws.settings import read_secret_string
from infra.testing.pytest_plugin import Database, Server
from tests.apps.serverless_app import SIGNUP
from tests.aws_fakes import (
    AWKWARD_PASSWORD,
    Aws,
    create_tables,
    function,
    settings_for,
)
from tests.password_login import Socket, admin, password_role, set_password

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")

ROTATED = "rotated: a new p@ss/word"
SECRET_NAME = "rds!db-rotating"


def rds_managed_secret(username: str, password: str) -> str:
    """A master user secret as RDS manages it: username and password, nothing else."""
    return json.dumps({"username": username, "password": password})


def login_of(db: Database) -> DatabaseLogin:
    """The test database's host, port and name, over the secret's fields."""
    socket = Socket.of(db)
    return DatabaseLogin(host=socket.directory, port=socket.port, name=db.name)


def rotate(db: Database, aws: Aws, role: str, arn: str) -> None:
    """What Secrets Manager's rotation does: a new password on the role, then in the secret;
    and the container's kept connections gone (recycled, or closed while it was frozen)."""
    set_password(db, role, ROTATED)
    aws.client("secretsmanager").put_secret_value(
        SecretId=arn, SecretString=rds_managed_secret(role, ROTATED)
    )
    admin(
        db,
        sql.SQL("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = {}").format(
            sql.Literal(role)
        ),
    )


def signup(event_id: str) -> dict[str, Any]:
    return {"event_type": SIGNUP, "event_id": event_id, "payload": {"email": f"{event_id}@ex.com"}}


async def test_a_rotated_password_is_picked_up_by_the_next_invocation(
    db: Database, server: Server, moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    await create_tables(db)
    aws = Aws(moto_endpoint)
    async with password_role(db, server, AWKWARD_PASSWORD, superuser=True) as role:
        arn = aws.client("secretsmanager").create_secret(
            Name=SECRET_NAME, SecretString=rds_managed_secret(role, AWKWARD_PASSWORD)
        )["ARN"]
        settings = dataclasses.replace(
            settings_for(db, aws.group),
            database_url=None,
            database_secret_arn=arn,
            database=login_of(db),
        )
        async with function(settings, aws=aws) as fn:
            assert (await fn.call(lambda_handlers.publish, signup("r-1")))["stored"] == ["r-1"]
            rotate(db, aws, role, arn)
            caplog.set_level(logging.INFO, logger="duly")
            published = await fn.call(lambda_handlers.publish, signup("r-2"))
            assert published["stored"] == ["r-2"], "the warm container logged in after rotation"
    again = [r for r in caplog.records if "database secret again" in r.getMessage()]
    assert len(again) == 1, [r.getMessage() for r in caplog.records]
    assert "refused" in again[0].getMessage()
    for record in caplog.records:
        assert ROTATED not in record.getMessage() and AWKWARD_PASSWORD not in record.getMessage()


async def test_a_copy_older_than_the_bound_is_read_again(
    db: Database, server: Server, moto_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    aws = Aws(moto_endpoint)
    client = aws.client("secretsmanager")
    async with password_role(db, server, AWKWARD_PASSWORD) as role:
        arn = client.create_secret(
            Name=SECRET_NAME, SecretString=rds_managed_secret(role, AWKWARD_PASSWORD)
        )["ARN"]
        settings = dataclasses.replace(settings_for(db), database_url=None, database_secret_arn=arn)
        reads: list[str] = []

        def read() -> str:
            reads.append(read_secret_string(settings, client))
            return reads[-1]

        now = [0.0]
        secret = RotatingSecret(read, login_of(db), max_age=900.0, clock=lambda: now[0])
        engine = create_async_engine(secret.url(), pool_size=1)
        secret.install(engine)
        try:
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT current_user")) == role
            rotate(db, aws, role, arn)
            now[0] = 899.0
            secret.url()
            assert len(reads) == 1, "a copy younger than the bound is kept"
            now[0] = 900.0
            caplog.set_level(logging.INFO, logger="duly")
            await engine.dispose()  # a new connection, as the pool opens one
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT current_user")) == role
        finally:
            await engine.dispose()
    assert len(reads) == 2, "read again once, before any login was refused"
    [again] = [r.getMessage() for r in caplog.records if "secret again" in r.getMessage()]
    assert "older than 900 s" in again


async def test_another_failure_to_connect_is_not_taken_for_a_rotation(
    db: Database, server: Server
) -> None:
    async with password_role(db, server, AWKWARD_PASSWORD) as role:
        reads: list[int] = []

        def read() -> str:
            reads.append(1)
            return rds_managed_secret(role, AWKWARD_PASSWORD)

        missing = dataclasses.replace(login_of(db), name="no_such_database")
        secret = RotatingSecret(read, missing, max_age=900.0)
        engine = create_async_engine(secret.url())
        secret.install(engine)
        try:
            with pytest.raises(Exception, match="no_such_database"):
                async with engine.connect():
                    pass
        finally:
            await engine.dispose()
        assert reads == [1], "a missing database is no refused password: nothing read again"
