"""`duly start NAME STEP --row JSON --args JSON`: the API's start of a run, from a terminal.

The request layer decides, as for `POST /workflows/{name}/start`: a step a run may not
start at (not an entry step) is refused with exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from typing import TextIO

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import DulyError, connect_workflows
from functions.cli.actor import cli_actor
from functions.cli.common import (
    SET_UP_ERRORS,
    Commands,
    add_database_url,
    app_database,
    command_body,
    on_database,
    set_up_refused,
)
from functions.cli.output import refused
from functions.command_line import FAILURE
from functions.requests.errors import ConflictError
from functions.requests.lookup import find_writable
from functions.requests.runs import StartRequest, start_run


def add_start(commands: Commands) -> None:
    """`duly start` and its options."""
    parser = commands.add_parser("start", help="start a run at one of its entry steps")
    add_database_url(parser)
    parser.add_argument("workflow", metavar="NAME", help="the workflow's table name")
    parser.add_argument("step", metavar="STEP", help="the step the run starts at")
    parser.add_argument("--row", default="{}", help="the row's columns as a JSON object")
    parser.add_argument("--args", default="{}", help="the step's arguments as a JSON object")
    parser.add_argument("--json", action="store_true", help="print JSON, for scripts")
    parser.set_defaults(command=run_start)


def run_start(args: argparse.Namespace) -> int:
    """`duly start`: exit 0 when the run started, 1 when one with its unique values exists,
    2 for a request refused (a step a run may not start at, a value that does not fit)."""
    try:
        url, _, _ = app_database(args, "duly start")
        body = command_body(StartRequest, args, {"step": args.step}, "row", "args")
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(
        start, workflow=args.workflow, body=body, as_json=args.json, out=sys.stdout
    )
    return asyncio.run(on_database(url, command))


async def start(
    Session: async_sessionmaker[AsyncSession],
    *,
    workflow: str,
    body: StartRequest,
    as_json: bool,
    out: TextIO,
) -> int:
    """Start the run the body describes, recorded as the user running the command."""
    async with connect_workflows(Session) as connection:
        try:
            info = find_writable(connection, workflow)
            started = await start_run(info, body, actor=cli_actor())
        except ConflictError as exc:
            print(f"duly: {exc}", file=sys.stderr)
            return FAILURE
        except DulyError as exc:
            return refused(exc)
    shown = f"Started {started['workflow']} run {started['key']} at {started['step']}."
    print(json.dumps(started, indent=2) if as_json else shown, file=out)
    return 0
