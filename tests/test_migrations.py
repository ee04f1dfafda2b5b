"""The deployable schema's Alembic migrations (infra/schema/migrate.py, its migrations),
`duly migrate`.

- duly's own first revision gives an empty database exactly what `create_all`
  makes for the example app and duly's tables: columns in order with their
  types, defaults and nullability, constraints, indexes with their WHERE
  (test_upgrading_an_empty_database_gives_what_create_all_makes), and
  autogenerate on the migrated database finds nothing, though it does find a
  dropped partial index (test_autogenerate_finds_no_difference_after_the_upgrade);
- the first upgrade works after a wake function's cold start made the slots,
  and two upgrades at once apply it once
  (test_the_upgrade_keeps_slots_a_cold_start_made, test_two_upgrades_at_once_apply_it_once);
- the target holds each table once, duly's own and the clock included
  (test_the_target_holds_each_table_once);
- `duly migrate` as an operator runs it: upgrade, again, check; a user's app
  in its own directory, two versions of it; `--sql` without a database, for
  a new app with no revision too (the whole schema, which autogenerate then
  finds complete); `--autogenerate` with no database, on a scratch one; the
  URL from a Secrets Manager secret; usage errors (2) and an unreachable
  database (1) say what to change.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import boto3
import pytest
from sqlalchemy import Column, Integer, MetaData, Table
from sqlalchemy.engine import make_url

from engine.base.audit import AUDIT_TABLE
from engine.base.clock import CLOCK_TABLE
from engine.base.owned_tables import declare_owned_tables
from engine.base.seen_signatures import SEEN_SIGNATURES_TABLE
from engine.base.sessions import SESSIONS_TABLE
from functions.cli import build_parser
from infra.aws import scheduler, wake_slots
from infra.aws.wake_slots import WakeSlots
from infra.schema import create_schema
from infra.schema.migrate import OWN_VERSIONS, deployable_metadata, migrations_for, target_metadata
from tests.conftest import Database, Server, fresh_database
from tests.helpers import DULY, REPO_ROOT, dev_env, run_duly
from tests.schema_helpers import HEAD, schema, tables, version

EXAMPLES = "functions.examples"
DULY_TABLES = {
    AUDIT_TABLE,
    CLOCK_TABLE,
    SEEN_SIGNATURES_TABLE,
    SESSIONS_TABLE,
    scheduler.TABLE,
    wake_slots.TABLE,
}


async def test_upgrading_an_empty_database_gives_what_create_all_makes(
    db: Database, server: Server
) -> None:
    migrations = migrations_for(EXAMPLES, None, db.url)
    assert migrations.versions == OWN_VERSIONS
    assert migrations.heads() == (HEAD,)
    engine = db.engine()
    assert await migrations.current(engine) == ()
    assert await migrations.upgrade(engine) == ((), (HEAD,))
    assert await migrations.current(engine) == (HEAD,)
    assert version(db) == [HEAD]

    async with fresh_database(server) as reference:
        await create_schema(reference.engine(), target_metadata(EXAMPLES))
        expected = schema(reference)
    assert schema(db) == expected

    # The comparison covers what matters: duly's tables, partial indexes, named constraints.
    assert DULY_TABLES | {"onboarding", "lookup", "duly_outbox", "workflow_attempt"} <= tables(db)
    assert (
        "index",
        "lookup",
        "ix_lookup_due_by_customer",
        "CREATE INDEX ix_lookup_due_by_customer ON public.lookup USING btree (customer, wake_at)"
        " WHERE (next_step IS NOT NULL)",
    ) in expected
    assert ("constraint", "duly_clock", "duly_clock_one_row", "CHECK ((id = 1))") in expected
    assert ("constraint", "onboarding", "onboarding_user_id_key", "UNIQUE (user_id)") in expected
    assert (
        "column",
        "digest",
        "1 id",
        "integer NOT NULL DEFAULT nextval('digest_id_seq'::regclass)",
    ) in expected


async def test_autogenerate_finds_no_difference_after_the_upgrade(db: Database) -> None:
    migrations = migrations_for(EXAMPLES, None, db.url)
    engine = db.engine()
    await migrations.upgrade(engine)
    assert await migrations.check(engine) == []

    # The check is real: a partial index missing from the database is found, with its WHERE.
    db.sql("DROP INDEX ix_lookup_running_by_customer")
    [(kind, index)] = await migrations.check(engine)
    assert (kind, index.name) == ("add_index", "ix_lookup_running_by_customer")
    assert str(index.dialect_options["postgresql"]["where"]) == "lookup.claimed_until IS NOT NULL"


async def test_the_upgrade_keeps_slots_a_cold_start_made(db: Database) -> None:
    engine = db.engine()
    await WakeSlots(engine, 3).ensure()  # a wake function ran before the first migration
    migrations = migrations_for(EXAMPLES, None, db.url)
    await migrations.upgrade(engine)
    assert version(db) == [HEAD]
    assert db.sql("SELECT slot FROM duly_wake_slots ORDER BY slot") == [(1,), (2,), (3,)]
    assert await migrations.check(engine) == []


def test_two_upgrades_at_once_apply_it_once(db: Database, tmp_path: Path) -> None:
    # Two deploys migrating at once: processes, as Alembic runs one command per process.
    env = dev_env(tmp_path / "pg", DULY_DATABASE_URL=db.url)
    processes = [
        subprocess.Popen(
            [*DULY, "migrate"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = sorted(process.communicate(timeout=60)[0] for process in processes)
    assert [process.returncode for process in processes] == [0, 0]
    assert outputs == [
        f"duly migrate: {db.name} at {HEAD} (was empty).\n",
        f"duly migrate: {db.name} at {HEAD}, unchanged.\n",
    ]
    assert version(db) == [HEAD]


def test_the_target_holds_each_table_once() -> None:
    first, second = MetaData(), MetaData()
    Table("orders", first, Column("id", Integer, primary_key=True))
    Table("invoices", second, Column("id", Integer, primary_key=True))
    for metadata in (first, second):  # every base that maps a workflow declares them all
        declare_owned_tables(metadata)

    target = deployable_metadata([first, second])
    keys = [key for metadata in target for key in metadata.tables]
    assert sorted(keys) == sorted({"orders", "invoices", *DULY_TABLES})
    assert target[0] is first  # kept as it is; the second is copied without duly's three
    assert set(target[1].tables) == {"invoices"}
    assert target[2:] == [scheduler.metadata, wake_slots.metadata]

    # An app that maps no workflow still gets the clock, the signatures and the sessions.
    alone = MetaData()
    Table("plain", alone, Column("id", Integer, primary_key=True))
    keys = [key for metadata in deployable_metadata([alone]) for key in metadata.tables]
    assert sorted(keys) == sorted({"plain", *DULY_TABLES})


# -- duly migrate --------------------------------------------------------------------------------


def migrate(
    *args: str, db: Database | None, tmp_path: Path, cwd: Path = REPO_ROOT, **settings: str
) -> subprocess.CompletedProcess[str]:
    """`duly migrate ARGS` with the test's database (None: no database setting at all)."""
    url = {"DULY_DATABASE_URL": db.url} if db is not None else {}
    return run_duly("migrate", *args, cwd=cwd, env=dev_env(tmp_path / "pg", **(url | settings)))


def test_duly_migrate_upgrades_the_examples_then_finds_nothing_to_do(
    db: Database, tmp_path: Path
) -> None:
    first = migrate(db=db, tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"duly migrate: {db.name} at {HEAD} (was empty).\n"
    assert version(db) == [HEAD]
    assert DULY_TABLES | {"onboarding", "expense"} <= tables(db)

    again = migrate(db=db, tmp_path=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"duly migrate: {db.name} at {HEAD}, unchanged.\n"

    checked = migrate("--check", db=db, tmp_path=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "the database matches" in checked.stdout

    db.sql("ALTER TABLE onboarding DROP COLUMN nudges")
    drifted = migrate("--check", db=db, tmp_path=tmp_path)
    assert drifted.returncode == 1
    assert "add_column" in drifted.stdout and "nudges" in drifted.stdout
    assert "1 differences" in drifted.stdout


SHOP_V1 = """
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, step


class Base(DeclarativeBase):
    pass


class Invoice(Base, Workflow):
    __tablename__ = "invoice"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String)

    @step
    async def send(self):
        return None
"""

# The next version of the app: a column and an index more.
SHOP_V2 = SHOP_V1.replace(
    "    customer: Mapped[str] = mapped_column(String)\n",
    "    customer: Mapped[str] = mapped_column(String, index=True)\n"
    "    amount: Mapped[int | None] = mapped_column(default=None)\n",
)


def test_duly_migrate_writes_and_applies_a_users_revisions(db: Database, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "shop.py").write_text(textwrap.dedent(SHOP_V1))
    revisions = project / "migrations"

    def run(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
        return migrate(*args, db=db, tmp_path=tmp_path, cwd=project, DULY_APP="shop", **settings)

    refused = run()  # duly's own revisions are not the shop's
    assert refused.returncode == 2
    assert "--directory or DULY_MIGRATIONS" in refused.stderr
    empty = run("--directory", "migrations")
    assert empty.returncode == 2
    assert "holds no revision" in empty.stderr and "--autogenerate" in empty.stderr

    written = run("--directory", "migrations", "--autogenerate", "-m", "initial schema")
    assert written.returncode == 0, written.stderr
    [initial] = revisions.glob("*.py")  # the revision alone: no env.py, no alembic.ini
    assert initial.name.endswith("_initial_schema.py")
    assert initial.name in written.stdout
    source = initial.read_text()
    assert (
        "ix_invoice_due" in source and "postgresql_where=sa.text('next_step IS NOT NULL')" in source
    )
    assert tables(db) == set()  # written, not applied (nor its version table)

    applied = run(DULY_MIGRATIONS="migrations")
    assert applied.returncode == 0, applied.stderr
    assert tables(db) == {"alembic_version", "invoice", *DULY_TABLES}

    (project / "shop.py").write_text(textwrap.dedent(SHOP_V2))
    stale = run("--check", DULY_MIGRATIONS="migrations")
    assert stale.returncode == 1
    second = run("--autogenerate", "-m", "amount", DULY_MIGRATIONS="migrations")
    assert second.returncode == 0, second.stderr
    [added] = set(revisions.glob("*.py")) - {initial}
    assert "op.add_column('invoice'" in added.read_text()
    assert run(DULY_MIGRATIONS="migrations").returncode == 0
    columns = db.sql(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'invoice'"
    )
    assert ("amount",) in columns
    assert ("ix_invoice_customer",) in db.sql(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'invoice'"
    )
    clean = run("--check", DULY_MIGRATIONS="migrations")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    nothing = run("--autogenerate", "-m", "nothing", DULY_MIGRATIONS="migrations")
    assert nothing.returncode == 0, nothing.stderr
    assert "nothing to write" in nothing.stdout
    assert len(list(revisions.glob("*.py"))) == 2


def test_duly_migrate_sql_prints_the_upgrade_without_a_database(tmp_path: Path) -> None:
    result = migrate("--sql", db=None, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    sql = result.stdout
    assert sql.startswith("BEGIN;")
    assert "CREATE TABLE IF NOT EXISTS duly_wake_slots (" in sql
    assert (
        "CREATE INDEX ix_lookup_running_by_customer ON lookup (customer) "
        "WHERE claimed_until IS NOT NULL;"
    ) in sql
    assert "INSERT INTO alembic_version (version_num) VALUES ('duly_0001')" in sql
    assert sql.rstrip().endswith("COMMIT;")


def test_duly_migrate_sql_prints_a_new_apps_schema_without_a_database(
    db: Database, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "shop.py").write_text(textwrap.dedent(SHOP_V1))

    def run(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
        return migrate(*args, cwd=project, tmp_path=tmp_path, DULY_APP="shop", **settings)

    printed = run("--sql", db=None)  # no revision, no directory named, no database
    assert printed.returncode == 0, printed.stderr
    sql = printed.stdout
    assert sql.startswith("-- duly migrate --sql: shop has no revision yet.")
    assert "\nBEGIN;\n" in sql and sql.rstrip().endswith("COMMIT;")
    assert "CREATE TABLE invoice (" in sql
    assert "CREATE INDEX ix_invoice_due ON invoice (wake_at) WHERE next_step IS NOT NULL;" in sql
    assert "CREATE TABLE IF NOT EXISTS duly_wake_slots (" in sql
    assert "CREATE TABLE IF NOT EXISTS duly_clock (" in sql
    assert "alembic_version" not in sql.split("COMMIT;")[0].split("BEGIN;")[1]
    named = run("--sql", "--directory", "migrations", db=None)  # named, still empty
    assert named.returncode == 0, named.stderr
    assert named.stdout.split("BEGIN;")[1] == sql.split("BEGIN;")[1]
    assert f"no revision in {project / 'migrations'} yet" in named.stdout

    # The SQL is the app's schema: applied, autogenerate finds nothing more to write.
    db.sql(sql)
    assert {"invoice", *DULY_TABLES} == tables(db)
    nothing = run("--directory", "migrations", "--autogenerate", "-m", "initial", db=db)
    assert nothing.returncode == 0, nothing.stderr
    assert "nothing to write" in nothing.stdout


def test_duly_migrate_autogenerates_without_a_database_on_a_scratch_one(
    db: Database, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "shop.py").write_text(textwrap.dedent(SHOP_V1))
    revisions = project / "migrations"

    def run(*args: str, db: Database | None) -> subprocess.CompletedProcess[str]:
        return migrate(
            *args,
            db=db,
            cwd=project,
            tmp_path=tmp_path,
            DULY_APP="shop",
            DULY_MIGRATIONS="migrations",
        )

    first = run("--autogenerate", "-m", "initial schema", db=None)
    assert first.returncode == 0, first.stderr
    assert "a scratch PostgreSQL at the newest revision" in first.stderr
    [initial] = revisions.glob("*.py")
    assert "op.create_table('invoice'" in initial.read_text()

    (project / "shop.py").write_text(textwrap.dedent(SHOP_V2))
    second = run("--autogenerate", "-m", "amount", db=None)
    assert second.returncode == 0, second.stderr
    [added] = set(revisions.glob("*.py")) - {initial}
    source = added.read_text()  # the scratch database was at the first revision
    assert "op.add_column('invoice'" in source and "create_table" not in source

    applied = run(db=db)
    assert applied.returncode == 0, applied.stderr
    assert ("amount",) in db.sql(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'invoice'"
    )
    assert run("--check", db=db).returncode == 0


def test_duly_migrate_reads_the_database_from_the_secret(
    db: Database, tmp_path: Path, moto_endpoint: str
) -> None:
    aws = {
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": moto_endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    client: Any = boto3.client(
        "secretsmanager",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    server = make_url(db.url)  # the embedded server is behind a unix socket
    secret = {
        "host": server.host or server.query["host"],
        "port": server.port or int(str(server.query.get("port", 5432))),
        "username": server.username,
        "password": server.password or "unused",  # trust authentication on the test server
        "dbname": db.name,
    }
    arn = client.create_secret(Name="duly-db", SecretString=json.dumps(secret))["ARN"]

    result = migrate(db=None, tmp_path=tmp_path, DULY_DATABASE_SECRET_ARN=arn, **aws)
    assert result.returncode == 0, result.stderr
    assert version(db) == [HEAD]

    unknown = arn.replace("duly-db", "nothing")
    missing = migrate(db=None, tmp_path=tmp_path, DULY_DATABASE_SECRET_ARN=unknown, **aws)
    assert missing.returncode == 1
    assert f"the database secret {unknown} cannot be read" in missing.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "pass --database-url or set DULY_DATABASE_URL or DULY_DATABASE_SECRET_ARN"),
        (("--autogenerate",), "--autogenerate needs -m MESSAGE"),
        (("-m", "title"), "-m MESSAGE goes with --autogenerate"),
        (("--sql", "--check"), "--sql and --check do not go together"),
        (("--check", "--revision", "duly_0001"), "--revision goes with an upgrade"),
        (("--database-url", "mysql://u@h/d"), "--database-url uses mysql://"),
        (("--sql", "--revision", "nope"), "Can't locate revision identified by 'nope'"),
    ],
)
def test_duly_migrate_usage_errors_say_what_to_change(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = migrate(*args, db=None, tmp_path=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_duly_migrate_says_when_the_database_cannot_be_reached(tmp_path: Path) -> None:
    result = migrate(
        "--database-url", "postgresql://nobody@127.0.0.1:1/nothing", db=None, tmp_path=tmp_path
    )
    assert result.returncode == 1
    assert "the database refused or cannot be reached" in result.stderr
    assert "Traceback" not in result.stderr


def test_duly_migrate_has_its_options() -> None:
    args = build_parser().parse_args(
        ["migrate", "--directory", "m", "--autogenerate", "-m", "t", "--database-url", "u"]
    )
    assert (args.directory, args.autogenerate, args.message, args.database_url) == (
        "m",
        True,
        "t",
        "u",
    )
    assert (args.sql, args.check, args.revision) == (False, False, None)
