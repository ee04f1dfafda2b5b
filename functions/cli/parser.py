"""The `duly` command line: its parser, and `main`, which runs the command chosen."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from engine.views.overview import RUN_STATES
from engine.views.runs import DEFAULT_PAGE, RUN_ORDERS
from functions.cli.audit import add_audit
from functions.cli.bulk import add_bulk
from functions.cli.deliver import add_deliver
from functions.cli.develop import print_db_url, print_version, run_dev
from functions.cli.init import add_init
from functions.cli.keys import add_keys
from functions.cli.migrate import run_migrate
from functions.cli.outbox import run_drain, run_replay
from functions.cli.prune import run_prune
from functions.cli.runs import run_runs, run_show, run_status
from functions.cli.schedules import add_schedules

SHOWN_ATTEMPTS = 50  # a run's newest attempts `duly show` prints


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `duly` console script."""
    args = build_parser().parse_args(argv)
    sys.exit(args.command(args))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `duly` and its subcommands."""
    parser = argparse.ArgumentParser(prog="duly", description="Durable workflows on PostgreSQL.")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    dev = commands.add_parser("dev", help="serve the app with a worker and a local PostgreSQL")
    dev.add_argument("--host", help="interface to serve on (default: DULY_HOST or 127.0.0.1)")
    dev.add_argument("--port", type=int, help="port to serve on (default: DULY_PORT or 8000)")
    dev.add_argument("--no-demo", action="store_true", help="do not start the demo Onboarding run")
    dev.add_argument(
        "--reset-clock",
        action="store_true",
        help="put the database clock back on PostgreSQL's time before serving",
    )
    dev.add_argument(
        "--serverless",
        action="store_true",
        help="no worker: run the wake handler as on AWS, with moto as EventBridge Scheduler",
    )
    dev.set_defaults(command=run_dev)
    db_url = commands.add_parser(
        "db-url", help="print the URL of the embedded PostgreSQL that duly dev runs"
    )
    db_url.set_defaults(command=print_db_url)
    drain = commands.add_parser(
        "drain", help="route every outbox event due now (DULY_APP's handlers), then exit"
    )
    add_database_url(drain)
    drain.set_defaults(command=run_drain)
    replay = commands.add_parser(
        "replay-dead-letters", help="make dead-lettered outbox events due again"
    )
    add_database_url(replay)
    replay.add_argument(
        "event_ids", nargs="*", metavar="EVENT_ID", help="only these events (default: every one)"
    )
    replay.set_defaults(command=run_replay)
    status = commands.add_parser(
        "status", help="every workflow table's runs by state, the next due instant, the outbox"
    )
    add_database_url(status)
    status.add_argument("--json", action="store_true", help="print JSON, for scripts")
    status.set_defaults(command=run_status)
    add_runs(commands)
    add_schedules(commands, add_database_url)
    add_deliver(commands, add_database_url)
    add_prune(commands)
    add_bulk(commands, add_database_url)
    add_audit(commands, add_database_url)
    add_migrate(commands)
    add_keys(commands)
    add_init(commands)
    show_version = commands.add_parser("version", help="print duly's version")
    show_version.set_defaults(command=print_version)
    return parser


def add_runs(commands: Any) -> None:
    """`duly runs` and `duly show`: a page of a workflow's runs, one run with its history."""
    runs = commands.add_parser(
        "runs", help="a page of a workflow's runs, filtered, newest or soonest due first"
    )
    add_database_url(runs)
    runs.add_argument("workflow", metavar="WORKFLOW", help="the workflow's table name")
    runs.add_argument("--state", choices=RUN_STATES, help="only runs in this state")
    runs.add_argument("--step", help="only runs at this step (their next step)")
    runs.add_argument("--key", help="only the run with this key")
    runs.add_argument("--error", help="only runs whose last error contains this text")
    runs.add_argument(
        "--where",
        metavar="TEXT",
        help="a filter, e.g. 'state:failed error:\"card declined\" since:1h' (the README's "
        "Searching runs)",
    )
    runs.add_argument("--order", choices=RUN_ORDERS, default="newest", help="default: newest")
    runs.add_argument(
        "--limit", type=int, default=DEFAULT_PAGE, help=f"runs a page (default {DEFAULT_PAGE})"
    )
    runs.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    runs.add_argument("--json", action="store_true", help="print JSON, for scripts")
    runs.set_defaults(command=run_runs)
    show = commands.add_parser("show", help="one run: its row, what it waits for, its history")
    add_database_url(show)
    show.add_argument("workflow", metavar="WORKFLOW", help="the workflow's table name")
    show.add_argument("key", metavar="KEY", help="the run's key (a JSON list if composite)")
    show.add_argument(
        "--attempts", type=int, default=SHOWN_ATTEMPTS, help=f"newest attempts shown "
        f"(default {SHOWN_ATTEMPTS})"
    )  # fmt: skip
    show.add_argument(
        "--failures", action="store_true", help="every failed attempt's arguments and "
        "traceback shown (default: the newest one's)"
    )  # fmt: skip
    show.add_argument("--json", action="store_true", help="print JSON, for scripts")
    show.set_defaults(command=run_show)


def add_prune(commands: Any) -> None:
    """`duly prune` and its options (see run_prune)."""
    prune = commands.add_parser(
        "prune",
        help="count (or with --apply, delete) what duly keeps past its retention period",
    )
    add_database_url(prune)
    prune.add_argument(
        "--apply", action="store_true", help="delete the rows (default: a dry run that counts)"
    )
    prune.add_argument(
        "--older-than-days",
        type=int,
        metavar="DAYS",
        help="one retention period for every kind (default: DULY_RETAIN_*_DAYS, else 30)",
    )
    prune.add_argument("--json", action="store_true", help="print JSON, for scripts")
    prune.set_defaults(command=run_prune)


def add_migrate(commands: Any) -> None:
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


DEV_DATABASE_DEFAULT = "DULY_DATABASE_URL, else that of the duly dev running here"


def add_database_url(parser: argparse.ArgumentParser, default: str = DEV_DATABASE_DEFAULT) -> None:
    """The --database-url option of the commands that work on any database."""
    parser.add_argument("--database-url", help=f"the workflow database (default: {default})")
