"""`duly drain` and `duly replay-dead-letters`: the outbox of DULY_APP, on any database.

A drain routes with the registrations the app makes at import on
`get_event_registry()`: the registry the app configured, else the module's
own `event_registry`, else a DatabaseEventRegistry holding what was
registered on the import-time default. An app with no registration at all is
refused: every event would be settled unrouted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import (
    DeadLetterFilter,
    DrainProgress,
    EventSettings,
    EventTables,
    Worker,
    WorkerOptions,
    WorkflowConnection,
    apply_replay,
    connect_workflows,
    drain_progress,
    due_event_ids,
    get_event_registry,
    plan_replay,
    replay_recorded,
    routing_of,
    start_replay,
)
from functions.cli.actor import cli_actor
from functions.cli.common import (
    SET_UP_ERRORS,
    CommandError,
    Commands,
    add_database_url,
    app_database,
    on_database,
    run_until_interrupted,
    set_up_refused,
)
from functions.cli.output import PLAIN_TICK, TTY_TICK, ProgressBar
from functions.cli.progress import BatchBar
from infra.app_config import configure_app_events, mapped_event_tables


@dataclass(frozen=True)
class EventApp:
    """What the outbox commands need: the database and the app's event tables."""

    url: str
    app_module: str
    tables: EventTables


def add_outbox(commands: Commands) -> None:
    """`duly drain` and `duly replay-dead-letters`."""
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


def load_event_app(args: argparse.Namespace, command: str) -> EventApp:
    """Read the database URL, import DULY_APP and find its outbox; CommandError if it cannot."""
    url, app_module, metadatas = app_database(args, command)
    tables = mapped_event_tables(metadatas)
    if tables is None:
        raise CommandError(
            f"{app_module} maps no outbox: map WorkflowOutbox, WorkflowEventRecord and "
            "WorkflowDeliveryAttempt on your base (or point DULY_APP at the module that does)."
        )
    return EventApp(url, app_module, tables)


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
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(drain_outbox, app=app, settings=settings, progress=sys.stderr)
    return run_until_interrupted(
        app.url,
        command,
        interrupted=(
            "duly drain: interrupted; the rows it held come due again when their "
            f"lease ends ({settings.outbox_claim_ttl_seconds} s)."
        ),
    )


async def drain_outbox(
    Session: async_sessionmaker[AsyncSession],
    *,
    app: EventApp,
    settings: EventSettings,
    progress: TextIO,
) -> int:
    """Route the outbox rows due now, and what they make due now; print what became of them."""
    tables = app.tables
    options = WorkerOptions(
        max_concurrency=settings.outbox_batch_size,
        lease=timedelta(seconds=settings.outbox_claim_ttl_seconds),
        listen=False,
    )
    async with connect_workflows(Session, workflows=[tables.outbox]) as connection:
        # A worker of our own, run until nothing is due: run_workflows would start its pass
        # loop (and a LISTEN connection) beside run_until_idle.
        worker = Worker(connection, options)
        ids, since = await due_event_ids(tables)
        bar = ProgressBar(progress, len(ids), tty=progress.isatty())
        watcher = asyncio.create_task(watch(bar, tables, ids, since, connection.autocommit))
        try:
            await worker.run_until_idle()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        result = await drain_progress(tables, ids, since)
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
        result = await drain_progress(tables, ids, since, engine=engine)
        bar.show(result.routed)


def drain_report(outbox: str, result: DrainProgress) -> str:
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


def run_replay(args: argparse.Namespace) -> int:
    """`duly replay-dead-letters`: make dead-lettered events due again; print how many."""
    try:
        app = load_event_app(args, "duly replay-dead-letters")
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(replay_dead_letters, app=app, event_ids=args.event_ids or None)
    return asyncio.run(on_database(app.url, command))


async def replay_dead_letters(
    Session: async_sessionmaker[AsyncSession], *, app: EventApp, event_ids: list[str] | None
) -> int:
    """Make the dead-lettered rows (all, or those of `event_ids`) due again; print how many.

    Every one is replayed in the bulk replay's batches (a bar on a terminal, each batch in
    the audit trail); chosen ids in one statement, recorded as one action.
    """
    async with connect_workflows(Session, workflows=[app.tables.outbox]) as connection:
        if event_ids is None:
            count = await replay_every_dead_letter(connection, app.tables, sys.stderr)
            replayed: list[str] = []
        else:
            replayed = await replay_recorded(app.tables, event_ids, cli_actor())
            count = len(replayed)
    print(
        f"duly replay-dead-letters: replayed {count} dead-lettered events in "
        f"{app.tables.outbox_table.name}; a worker (or duly drain) routes them again.",
        flush=True,
    )
    done = set(replayed)
    left = [event_id for event_id in event_ids or () if event_id not in done]
    if left:
        print(f"not dead-lettered, or unknown: {', '.join(left)}", file=sys.stderr)
    return 0


async def replay_every_dead_letter(
    connection: WorkflowConnection, tables: EventTables, progress: TextIO
) -> int:
    """Every dead letter there is now replayed, batch by batch; how many."""
    plan = await plan_replay(connection, tables, DeadLetterFilter())
    start = await start_replay(
        connection, tables, DeadLetterFilter(), expected=plan.matched, upto=plan.upto
    )
    done = 0
    with BatchBar(progress, "replaying", plan.matched) as bar:
        batches = apply_replay(connection, tables, DeadLetterFilter(), start, cli_actor())
        async for reached in batches:
            bar.update(reached.done, reached.skipped)
            done = reached.done
    return done
