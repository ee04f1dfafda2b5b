"""The migrate function (functions/lambdas/migrate.py), as CloudFormation's custom resource.

Real requests (tests/events/custom_resource_*.json) with their ResponseURL pointed at
a loopback HTTP server that keeps each PUT; a real PostgreSQL (the suite's `db`):
- Create migrates to the newest revision, Update finds it done, Delete changes
  nothing, each answered once with the request's ids and one PhysicalResourceId;
- a revision that fails midway answers FAILED and leaves the tables and
  alembic_version as they were;
- a deploy waits for another's lock, and one that cannot get it in its time
  answers FAILED before the invocation ends, with nothing committed;
- an Update that finds the database at a revision its code does not know (a
  rollback) leaves it and answers SUCCESS;
- a request the function cannot serve (no database setting) is answered FAILED,
  and an answer nobody takes is logged, never raised.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from functions.lambdas.migrate import ANSWER_MARGIN, on_deploy
from infra.schema.migrate import LOCK_KEY, OWN_VERSIONS
from infra.testing.pytest_plugin import Server
from tests.aws_fakes import AWKWARD_PASSWORD, Context, aws_client
from tests.conftest import Database
from tests.helpers import free_port, wait_until
from tests.password_login import Socket, password_role
from tests.schema_helpers import HEAD, schema, tables, version

EVENTS = Path(__file__).resolve().parent / "events"
EXAMPLES = "functions.examples"
FAILING_REVISION = '''
"""A revision that creates a table, alters another, then fails."""

import sqlalchemy as sa
from alembic import op

revision = "duly_failing_next"
down_revision = "{head}"


def upgrade() -> None:
    op.create_table("half_done", sa.Column("id", sa.Integer, primary_key=True))
    op.add_column("onboarding", sa.Column("later", sa.Integer))
    raise RuntimeError("the next revision fails midway")


def downgrade() -> None:
    pass
'''


class Answers:
    """A loopback HTTP server standing in for the presigned S3 URL: the PUTs it was sent."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        answers = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                answers.received.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, request_id: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/responses/{request_id}?X-Amz-Signature=abc"

    def only(self) -> dict[str, Any]:
        """The one answer received, its headers checked as S3 would."""
        [(path, headers, body)] = self.received
        assert path.startswith(f"/responses/{body['RequestId']}?")
        assert headers["Content-Type"] == ""  # what the URL was presigned with
        self.received.clear()
        return body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def answers() -> Iterator[Answers]:
    server = Answers()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, db: Database) -> pytest.MonkeyPatch:
    """The migrate function's environment: the test's database, the examples."""
    monkeypatch.setenv("DULY_DATABASE_URL", db.url)
    monkeypatch.setenv("DULY_APP", EXAMPLES)
    monkeypatch.delenv("DULY_MIGRATIONS", raising=False)
    monkeypatch.delenv("DULY_DATABASE_SECRET_ARN", raising=False)
    return monkeypatch


def request(kind: str, answers: Answers) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / f"custom_resource_{kind}.json").read_text())
    event["ResponseURL"] = answers.url(event["RequestId"])
    return event


def migrate_threads_ended() -> bool:
    return not any(thread.name == "duly-migrate" for thread in threading.enumerate())


def test_create_migrates_update_finds_it_done_delete_changes_nothing(
    db: Database, settings: pytest.MonkeyPatch, answers: Answers
) -> None:
    create = request("create", answers)
    assert on_deploy(create, Context(30.0))["Status"] == "SUCCESS"
    created = answers.only()
    assert created == {
        "Status": "SUCCESS",
        "Reason": f"{db.name} migrated to {HEAD} (was empty).",
        "PhysicalResourceId": "shop-Migrations",  # the stack's name and the logical id
        "StackId": create["StackId"],
        "RequestId": create["RequestId"],
        "LogicalResourceId": "Migrations",
        "NoEcho": False,
        "Data": {"Revision": HEAD},
    }
    assert version(db) == [HEAD]
    assert {"onboarding", "duly_wake_slots", "duly_clock"} <= tables(db)
    migrated = schema(db)

    update = request("update", answers)
    assert update["PhysicalResourceId"] == created["PhysicalResourceId"]
    on_deploy(update, Context(30.0))
    updated = answers.only()
    assert (updated["Status"], updated["Reason"]) == ("SUCCESS", f"{db.name} already at {HEAD}.")
    assert updated["PhysicalResourceId"] == "shop-Migrations"
    assert updated["RequestId"] == update["RequestId"]

    on_deploy(request("delete", answers), Context(30.0))
    deleted = answers.only()
    assert (deleted["Status"], deleted["PhysicalResourceId"]) == ("SUCCESS", "shop-Migrations")
    assert "left as it is" in deleted["Reason"]
    assert schema(db) == migrated
    assert version(db) == [HEAD]


def test_a_revision_that_fails_midway_answers_failed_and_changes_nothing(
    db: Database, settings: pytest.MonkeyPatch, answers: Answers, tmp_path: Path
) -> None:
    versions = tmp_path / "versions"
    shutil.copytree(OWN_VERSIONS, versions, ignore=shutil.ignore_patterns("__pycache__"))
    settings.setenv("LAMBDA_TASK_ROOT", str(tmp_path))  # the bundle's root, as on Lambda
    settings.setenv("DULY_MIGRATIONS", "versions")
    on_deploy(request("create", answers), Context(30.0))
    assert answers.only()["Status"] == "SUCCESS"
    before = (schema(db), tables(db), version(db))

    (versions / "duly_failing_next.py").write_text(
        textwrap.dedent(FAILING_REVISION.format(head=HEAD))
    )
    said = on_deploy(request("update", answers), Context(30.0))
    failed = answers.only()
    assert failed["Status"] == "FAILED" == said["Status"]
    assert failed["Reason"] == (
        "Not migrated, the schema is as it was: RuntimeError: the next revision fails midway"
    )
    assert failed["PhysicalResourceId"] == "shop-Migrations"
    assert (schema(db), tables(db), version(db)) == before
    assert "half_done" not in tables(db)


async def test_a_deploy_waits_for_the_lock_another_deploy_holds(
    db: Database, settings: pytest.MonkeyPatch, answers: Answers
) -> None:
    holder = await psycopg.AsyncConnection.connect(db.conninfo)
    try:
        await holder.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        deploy = asyncio.create_task(
            asyncio.to_thread(on_deploy, request("create", answers), Context(30.0))
        )
        await wait_until(lambda: waiting_for_the_lock(db), timeout=10, what="a wait on the lock")
        assert answers.received == [] and not deploy.done()
        await holder.commit()  # the other deploy ends: this one goes on
        said = await deploy
    finally:
        await holder.close()
    assert said["Status"] == "SUCCESS"
    assert answers.only()["Reason"] == f"{db.name} migrated to {HEAD} (was empty)."
    assert version(db) == [HEAD]


async def test_a_deploy_that_cannot_get_the_lock_in_time_answers_failed_before_its_end(
    db: Database, settings: pytest.MonkeyPatch, answers: Answers
) -> None:
    remaining = ANSWER_MARGIN + 2.0  # seconds: two to migrate in, then the margin to answer
    holder = await psycopg.AsyncConnection.connect(db.conninfo)
    try:
        await holder.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        started = time.monotonic()
        said = await asyncio.to_thread(on_deploy, request("create", answers), Context(remaining))
        took = time.monotonic() - started
        # The database bounds the lock wait too: the migration's thread ends on its own.
        await wait_until(migrate_threads_ended, timeout=10, what="the migration's end")
    finally:
        await holder.close()
    assert said["Status"] == "FAILED"
    assert took < remaining - 1.0, "answered with time to spare"
    failed = answers.only()
    assert failed["Status"] == "FAILED"
    assert "did not finish within 2 s" in failed["Reason"]
    assert tables(db) == set()  # not even alembic_version


def test_an_update_that_finds_a_newer_release_s_revision_leaves_it(
    db: Database, settings: pytest.MonkeyPatch, answers: Answers, tmp_path: Path
) -> None:
    on_deploy(request("create", answers), Context(30.0))  # the newer release migrated
    assert answers.only()["Status"] == "SUCCESS"
    migrated = schema(db)
    older = tmp_path / "older"  # the release a rollback goes back to: one revision fewer
    shutil.copytree(OWN_VERSIONS, older, ignore=shutil.ignore_patterns("__pycache__"))
    [newest] = older.glob(f"{HEAD}_*.py")
    newest.unlink()
    settings.setenv("DULY_MIGRATIONS", str(older))

    on_deploy(request("update", answers), Context(30.0))
    kept = answers.only()
    assert kept["Status"] == "SUCCESS"
    assert kept["Reason"] == (
        f"{db.name} is left at {HEAD}, a revision this release does not know (a newer "
        "release's, as when a deploy rolls back)."
    )
    assert (schema(db), version(db)) == (migrated, [HEAD])


def test_an_answer_nobody_takes_is_logged_never_raised(
    caplog: pytest.LogCaptureFixture, answers: Answers
) -> None:
    event = request("delete", answers)
    event["ResponseURL"] = f"http://127.0.0.1:{free_port()}/nobody"
    started = time.monotonic()
    said = on_deploy(event, Context(2.0))
    assert said["Status"] == "SUCCESS"
    assert time.monotonic() - started < 2.0, "gave up within the invocation's time"
    assert "CloudFormation was never answered SUCCESS" in caplog.text


def test_without_a_database_setting_create_answers_failed_and_delete_succeeds(
    monkeypatch: pytest.MonkeyPatch, answers: Answers
) -> None:
    for name in ("DULY_DATABASE_URL", "DULY_DATABASE_SECRET_ARN", "DULY_MIGRATIONS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DULY_APP", EXAMPLES)
    on_deploy(request("create", answers), Context(30.0))
    failed = answers.only()
    assert failed["Status"] == "FAILED"
    assert failed["Reason"] == (
        "Not migrated, the schema is as it was: ConfigurationError: The migrate function "
        "needs DULY_DATABASE_URL, DULY_DATABASE_SECRET_ARN, or IAM auth with "
        "DULY_DATABASE_HOST and DULY_DATABASE_USER."
    )
    on_deploy(request("delete", answers), Context(30.0))  # Delete never reaches the database
    assert answers.only()["Status"] == "SUCCESS"


def test_an_event_that_is_no_custom_resource_request_is_refused_without_raising() -> None:
    said = on_deploy({"duly": "wake"}, Context(30.0))
    assert said["Status"] == "FAILED"
    assert "no RequestType, ResponseURL, StackId, RequestId, LogicalResourceId" in said["Reason"]


def waiting_for_the_lock(db: Database) -> bool:
    rows = db.sql(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database() "
        "AND a.application_name = 'duly-migrate'"
    )
    return rows[0][0] == 1


async def test_create_logs_in_as_the_other_functions_do_with_an_rds_managed_secret(
    db: Database,
    server: Server,
    moto_endpoint: str,
    answers: Answers,
    settings: pytest.MonkeyPatch,
) -> None:
    """A master user secret RDS manages holds only the username and password: the migrate
    function, like the four others, takes the host, port and name from the settings."""
    async with password_role(db, server, AWKWARD_PASSWORD, superuser=True) as role:
        secret = json.dumps({"username": role, "password": AWKWARD_PASSWORD})
        arn = aws_client(moto_endpoint, "secretsmanager").create_secret(
            Name="rds!db-migrate", SecretString=secret
        )["ARN"]
        socket = Socket.of(db)
        settings.delenv("DULY_DATABASE_URL")
        for name, value in {
            "DULY_DATABASE_SECRET_ARN": arn,
            "DULY_DATABASE_HOST": socket.directory,
            "DULY_DATABASE_PORT": str(socket.port),
            "DULY_DATABASE_NAME": db.name,
            "AWS_ENDPOINT_URL": moto_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",  # as Lambda sets them
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }.items():
            settings.setenv(name, value)
        answer = await asyncio.to_thread(on_deploy, request("create", answers), Context(30.0))
        assert answer["Status"] == "SUCCESS", answer
        assert version(db) == [HEAD]
