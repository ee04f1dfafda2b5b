"""`duly schedules [NAME]` and `duly schedules pause|resume|trigger NAME KEY`.

The list is the API's `GET /schedules`; an action is the API's too, recorded in
the audit trail as the user running the command (`functions.cli.actor`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import SCHEDULE_ACTIONS, DulyError, RunBusyError, ScheduledRun, connect_workflows
from functions.cli.actor import cli_actor
from functions.cli.common import (
    SET_UP_ERRORS,
    Commands,
    add_database_url,
    app_database,
    on_database,
    set_up_refused,
)
from functions.cli.output import aligned, refused
from functions.command_line import FAILURE, USAGE_ERROR
from functions.requests import schedules

SHOWN_TIME = "%Y-%m-%d %H:%M:%S %Z"


def add_schedules(commands: Commands) -> None:
    """`duly schedules`: the list, or one action on one run."""
    parser = commands.add_parser(
        "schedules",
        help="the runs every(...) keeps going; or pause, resume or trigger one",
        description="duly schedules [NAME] lists them; "
        "duly schedules pause|resume|trigger NAME KEY acts on one run.",
    )
    add_database_url(parser)
    parser.add_argument(
        "words", nargs="*", metavar="[ACTION] NAME [KEY]", help="a workflow, or an action on a run"
    )
    parser.add_argument("--json", action="store_true", help="print JSON, for scripts")
    parser.set_defaults(command=run_schedules)


def run_schedules(args: argparse.Namespace) -> int:
    """`duly schedules`: list the scheduled runs, or pause, resume or trigger one."""
    words: list[str] = args.words
    acting = bool(words) and words[0] in SCHEDULE_ACTIONS
    if (acting and len(words) != 3) or (not acting and len(words) > 1):
        print(
            "duly: give a workflow to list its schedules, or "
            f"{'|'.join(SCHEDULE_ACTIONS)} NAME KEY to act on one run.",
            file=sys.stderr,
        )
        return USAGE_ERROR
    try:
        url, _, _ = app_database(args, "duly schedules")
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(
        act_on_schedule if acting else print_schedules,
        words=words,
        as_json=args.json,
        out=sys.stdout,
    )
    return asyncio.run(on_database(url, command))


async def print_schedules(
    Session: async_sessionmaker[AsyncSession], *, words: Sequence[str], as_json: bool, out: TextIO
) -> int:
    """Print the scheduled runs (of one workflow, when named) as a table or JSON."""
    async with connect_workflows(Session) as connection:
        try:
            found = await schedules.scheduled_runs(connection, words[0] if words else None)
        except DulyError as exc:
            return refused(exc)
    if as_json:
        print(json.dumps({"schedules": [run.to_dict() for run in found]}, indent=2), file=out)
    else:
        print(schedules_table(found), file=out)
    return 0


def schedules_table(found: Sequence[ScheduledRun]) -> str:
    """The scheduled runs as aligned columns: one line a run."""
    if not found:
        return "no run is on a schedule"
    lines = [["workflow", "key", "step", "schedule", "timezone", "next firing", "last firing"]]
    for run in found:
        if run.paused:
            next_firing = "paused"
        elif run.running:
            next_firing = "running now"
        else:
            next_firing = run.next_firing.strftime(SHOWN_TIME) if run.next_firing else "-"
        last = run.last_firing.strftime(SHOWN_TIME) if run.last_firing else "-"
        schedule = f"{run.kind} {run.expression}"
        lines.append(
            [run.workflow, run.key, run.step, schedule, run.timezone or "-", next_firing, last]
        )
    return aligned(lines, right=set())


async def act_on_schedule(
    Session: async_sessionmaker[AsyncSession], *, words: Sequence[str], as_json: bool, out: TextIO
) -> int:
    """Pause, resume or trigger one scheduled run, as the user running the command."""
    action, workflow, key = words
    actor = cli_actor()
    async with connect_workflows(Session) as connection:
        try:
            steered = await schedules.steer(
                connection, workflow, key, action, actor=actor.id, via=actor.via
            )
        except RunBusyError as exc:
            print(f"duly: {exc}", file=sys.stderr)
            return FAILURE
        except DulyError as exc:
            return refused(exc)
    print(json.dumps(steered, indent=2) if as_json else steered["message"], file=out)
    return 0
