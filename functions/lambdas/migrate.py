"""The migrate function: the handler of template.yaml's `Custom::DulyMigrate` resource.

Create and Update upgrade DULY_APP's database to its newest revision
(DULY_MIGRATIONS, else duly's own for the examples) through `infra.schema.migrate`: one
transaction under its advisory lock. Delete changes nothing. Every invocation
answers CloudFormation once, SUCCESS or FAILED, before its time runs out; a
migration not done by then is rolled back, never committed after the answer.
Why: docs/architecture.md, "Migrations on deploy".
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from engine import ConfigurationError, settings as variables
from functions.lambdas.custom_resource import Outcome, Request, RequestUnreadable, answer
from functions.lambdas.runtime import Budget
from infra.aws.database_login import DatabaseLogin
from infra.aws.iam_auth import install_iam_auth
from infra.aws.settings import AwsSettings, resolve_database_url
from infra.schema.migrate import migrations_for

log = logging.getLogger("duly.lambda")

ANSWER_MARGIN = 5.0  # seconds kept at the end of the invocation to answer CloudFormation
BOTO_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 10}  # seconds
CONNECT_TIMEOUT = 10  # seconds, to reach the database
TASK_ROOT = "LAMBDA_TASK_ROOT"  # where Lambda unpacked the bundle
PASSWORD_IN_URL = re.compile(r"://([^:/@\s]+):[^@\s]+@")

# Alembic's context is a module global: one migration per container at a time, even when a
# timed-out one is still winding down on its thread.
_migrating = threading.Lock()


class TooLate(Exception):
    """The invocation answered FAILED before the migration was ready to commit."""


class CommitGate:
    """Decides, once, whether the migration commits or the deadline answers first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = "open"  # then "committing" or "closed", never back

    def enter(self) -> None:
        """Called last in the migration's transaction: TooLate (a rollback) once closed."""
        with self._lock:
            if self._state == "closed":
                raise TooLate("The invocation had answered FAILED: rolled back.")
            self._state = "committing"

    def close(self) -> bool:
        """Shut the gate at the deadline; False when the commit is already under way."""
        with self._lock:
            if self._state == "committing":
                return False
            self._state = "closed"
            return True


def on_deploy(event: Any, context: Any) -> dict[str, str]:
    """Answer one custom resource request: migrate on Create and Update, nothing on Delete."""
    budget = Budget.of(context, ANSWER_MARGIN)
    try:
        request = Request.of(event)
    except RequestUnreadable as exc:  # no ResponseURL to answer at
        log.error("%s", exc)
        return {"Status": "FAILED", "Reason": str(exc)}
    try:
        outcome = outcome_of(request, budget)
    except Exception as exc:
        log.exception("The migration failed.")
        outcome = Outcome("FAILED", reason_of(exc))
    answer(request, outcome, budget.left)
    return {"Status": outcome.status, "Reason": outcome.reason}


def outcome_of(request: Request, budget: Budget) -> Outcome:
    """What to answer `request`: the migration's outcome, or SUCCESS for a Delete."""
    if request.request_type == "Delete":
        return Outcome("SUCCESS", "Deleted: the database schema is left as it is.")
    if request.request_type not in ("Create", "Update"):
        return Outcome("FAILED", "RequestType is none of Create, Update and Delete.")
    return migrate_in_time(budget)


def migrate_in_time(budget: Budget) -> Outcome:
    """Migrate to the newest revision on a thread; FAILED, rolled back, if not done in time."""
    limit = budget.until_stop()
    if limit <= 0:
        return Outcome("FAILED", "No time left to migrate: raise the function's Timeout.")
    gate = CommitGate()
    done: list[Outcome] = []
    failed: list[Exception] = []

    def work() -> None:
        if not _migrating.acquire(timeout=limit):
            failed.append(TimeoutError("An earlier migration still runs in this container."))
            return
        try:
            done.append(asyncio.run(migrate_to_head(gate, limit)))
        except Exception as exc:
            failed.append(exc)
        finally:
            _migrating.release()

    thread = threading.Thread(target=work, name="duly-migrate", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive() and gate.close():
        return Outcome(
            "FAILED",
            f"The migration did not finish within {limit:.0f} s, the invocation's time less "
            f"{ANSWER_MARGIN:.0f} s: rolled back, nothing changed. Raise the migrate "
            "function's Timeout, or run duly migrate from a host that reaches the database.",
        )
    thread.join(max(0.0, budget.left() - 1.0))  # the commit was under way: let it end
    if thread.is_alive():
        return Outcome(
            "FAILED",
            "The migration's commit did not end in time: duly migrate --check says where "
            "the database is.",
        )
    if failed:
        raise failed[0]
    return done[0]


async def migrate_to_head(gate: CommitGate, time_limit: float) -> Outcome:
    """Upgrade DULY_APP's database to the newest revision, committing through `gate`."""
    url, login = database_url_of_environment()
    migrations = migrations_for(variables.APP.read(), revisions_directory(), url)
    if not (migrations.versions.is_dir() and migrations.heads()):
        return Outcome(
            "FAILED",
            f"{migrations.versions} holds no revision: write the first with duly migrate "
            "--autogenerate -m 'initial schema' and build it into the bundle.",
        )
    engine = create_async_engine(
        url,
        poolclass=NullPool,
        connect_args={
            "prepare_threshold": None,
            "application_name": "duly-migrate",
            "connect_timeout": CONNECT_TIMEOUT,
        },
    )
    if login.iam_auth:
        import boto3
        from botocore.config import Config

        install_iam_auth(engine, lambda: boto3.client("rds", config=Config(**BOTO_TIMEOUTS)))
    try:
        before, after = await migrations.upgrade(
            engine, keep_unknown=True, time_limit=time_limit, before_commit=gate.enter
        )
    finally:
        await engine.dispose()
    database = engine.url.database
    revision = ", ".join(after) or "base"
    if migrations.unknown(after):
        log.warning("%s is at %s, which these revisions do not know.", database, revision)
        reason = (
            f"{database} is left at {revision}, a revision this release does not know "
            "(a newer release's, as when a deploy rolls back)."
        )
    elif after != before:
        reason = f"{database} migrated to {revision} (was {', '.join(before) or 'empty'})."
    else:
        reason = f"{database} already at {revision}."
    return Outcome("SUCCESS", reason, {"Revision": revision})


def revisions_directory() -> Path | None:
    """DULY_MIGRATIONS, a relative one taken from the bundle's root (LAMBDA_TASK_ROOT)."""
    named = variables.MIGRATIONS.read()
    if not named:
        return None
    return Path(os.environ.get(TASK_ROOT, ".")) / named  # an absolute `named` stays as it is


def database_url_of_environment() -> tuple[str, DatabaseLogin]:
    """DULY_DATABASE_URL, else the URL of DULY_DATABASE_SECRET_ARN's secret, else the
    settings' (IAM auth), as the other functions connect; and how to log in."""
    login = DatabaseLogin.from_env()
    url, arn = variables.DATABASE_URL.read(), variables.DATABASE_SECRET_ARN.read()
    if not url and not arn and not login.complete:
        raise ConfigurationError(
            "The migrate function needs DULY_DATABASE_URL, DULY_DATABASE_SECRET_ARN, or IAM "
            "auth with DULY_DATABASE_HOST and DULY_DATABASE_USER."
        )
    import boto3
    from botocore.config import Config

    # Only the database fields matter to resolve_database_url.
    settings = AwsSettings(
        url or None,
        arn or None,
        wake_function_arn="",
        schedule_group="",
        scheduler_role_arn="",
        database=login,
    )
    found = resolve_database_url(
        settings, lambda: boto3.client("secretsmanager", config=Config(**BOTO_TIMEOUTS))
    )
    return found, login


def reason_of(exc: BaseException) -> str:
    """A Reason for CloudFormation's stack events: the error's first line, no password."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(cause).strip().splitlines()
    said = PASSWORD_IN_URL.sub(r"://\1:***@", lines[0] if lines else "")
    return f"Not migrated, the schema is as it was: {type(cause).__name__}: {said}"
