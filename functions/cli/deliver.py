"""`duly deliver NAME STEP --key K --args JSON`: the API's delivery, from a terminal.

It says, one clause a kind, whether the run took the event now, holds it until it waits for
it, or refused it and why; exit status 1 when no run took or held it.
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
from functions.requests.lookup import find_writable
from functions.requests.runs import (
    DeliverRequest,
    deliver_event,
    delivery_answer,
    url_key,
)


def add_deliver(commands: Commands) -> None:
    """`duly deliver` and its options."""
    parser = commands.add_parser(
        "deliver", help="deliver an event to a run: taken now, held until it waits, or refused"
    )
    add_database_url(parser)
    parser.add_argument("workflow", metavar="NAME", help="the workflow's table name")
    parser.add_argument("step", metavar="STEP", help="the step the event is for")
    parser.add_argument("--key", required=True, help="the run's key (a JSON list if composite)")
    parser.add_argument("--args", default="{}", help="the step's arguments as a JSON object")
    parser.add_argument("--idempotency-key", help="refused if the run took this key already")
    parser.add_argument("--restart", action="store_true", help="start a finished run again")
    parser.add_argument("--json", action="store_true", help="print JSON, for scripts")
    parser.set_defaults(command=run_deliver)


def run_deliver(args: argparse.Namespace) -> int:
    """`duly deliver`: exit 0 when the run took or holds the event, 1 when it refused it."""
    try:
        url, _, _ = app_database(args, "duly deliver")
        body = delivery_body(args)
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(
        deliver, workflow=args.workflow, key=args.key, body=body, as_json=args.json, out=sys.stdout
    )
    return asyncio.run(on_database(url, command))


def delivery_body(args: argparse.Namespace) -> DeliverRequest:
    """The request body the options spell; ValueError naming what is not JSON."""
    document = {
        "step": args.step,
        "idempotency_key": args.idempotency_key,
        "restart": args.restart,
    }
    return command_body(DeliverRequest, args, document, "args")


async def deliver(
    Session: async_sessionmaker[AsyncSession],
    *,
    workflow: str,
    key: str,
    body: DeliverRequest,
    as_json: bool,
    out: TextIO,
) -> int:
    """Deliver the event to the run `key` names (read once, as a URL spells it) and print the
    answer (the API's JSON, or its sentence)."""
    async with connect_workflows(Session) as connection:
        try:
            info = find_writable(connection, workflow)
            delivered = await deliver_event(info, body, url_key(info, key))
        except DulyError as exc:
            return refused(exc)
    answer = delivery_answer(info, delivered)
    print(json.dumps(answer, indent=2) if as_json else delivered.explanation(), file=out)
    return 0 if delivered else FAILURE
