"""`duly bulk retry|run|cancel WORKFLOW` and `duly bulk replay`: every run (or dead letter)
a filter matches, a dry run unless `--apply` confirms the count (`--expected`) and key
(`--upto`) the dry run printed; then batch after batch, with a progress bar on a terminal.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import RUN_STATES, DulyError, connect_workflows, find_workflow
from functions.cli.actor import cli_actor
from functions.cli.common import (
    SET_UP_ERRORS,
    CommandError,
    Commands,
    add_database_url,
    app_database,
    run_until_interrupted,
    set_up_refused,
)
from functions.cli.outbox import load_event_app
from functions.cli.output import refused
from functions.cli.progress import BatchBar
from functions.requests.bulk import (
    BulkReplayRequest,
    BulkRunsRequest,
    bulk_replay,
    bulk_runs,
)
from functions.requests.errors import InputError


def add_bulk(commands: Commands) -> None:
    """`duly bulk` and its actions."""
    bulk = commands.add_parser(
        "bulk", help="retry, run a step on, or cancel every run a filter matches; replay dead "
        "letters (a dry run unless --apply)"
    )  # fmt: skip
    actions = bulk.add_subparsers(title="actions", required=True, metavar="ACTION")
    for action, says in (
        ("retry", "run a step again on the failed runs that match"),
        ("run", "run a step now on the runs that match, replacing what they had scheduled"),
        ("cancel", "end the runs that match where they stand"),
    ):
        parser = actions.add_parser(action, help=says)
        add_database_url(parser)
        parser.add_argument("workflow", metavar="WORKFLOW", help="the workflow's table name")
        parser.add_argument("--state", choices=RUN_STATES, help="only runs in this state")
        parser.add_argument("--at", metavar="STEP", help="only runs at this step (their next)")
        parser.add_argument("--key", help="only the run with this key")
        parser.add_argument("--error", help="only runs whose last error contains this text")
        parser.add_argument(
            "--where", metavar="TEXT", help="a search, as duly runs --where reads it (ANDed)"
        )
        if action != "cancel":
            parser.add_argument("--step", required=True, help="the step to run")
            parser.add_argument("--args", default="{}", help="its arguments, a JSON object")
        add_confirmation(parser)
        parser.set_defaults(command=run_bulk, action=action)
    replay = actions.add_parser("replay", help="make the dead letters that match due again")
    add_database_url(replay)
    replay.add_argument("--event-name", help="only events of this name")
    replay.add_argument("--route", help="only those a route dead-lettered (handler or digest)")
    replay.add_argument("--error", help="only those whose error contains this text")
    add_confirmation(replay)
    replay.set_defaults(command=run_bulk, action="replay")


def add_confirmation(parser: argparse.ArgumentParser) -> None:
    """--apply and the dry run's figures it confirms."""
    parser.add_argument("--apply", action="store_true", help="act (default: a dry run)")
    parser.add_argument("--expected", type=int, help="with --apply: the count the dry run gave")
    parser.add_argument("--upto", help="with --apply: the key (or event id) the dry run gave")
    parser.add_argument("--json", action="store_true", help="print JSON, for scripts")


def request_of(args: argparse.Namespace) -> BulkRunsRequest | BulkReplayRequest:
    """The request layer's body for the command's arguments; CommandError when they do not fit."""
    if args.apply and args.expected is None:
        raise CommandError("--apply needs --expected and --upto: run the dry run first.")
    if not args.apply and (args.expected is not None or args.upto is not None):
        raise CommandError("--expected and --upto confirm an --apply: add --apply.")
    confirmed = {"expected": args.expected, "upto": args.upto} if args.apply else {}
    try:
        if args.action == "replay":
            given = {"event_name": args.event_name, "route": args.route, "error": args.error}
            return BulkReplayRequest.model_validate({"filter": given, **confirmed})
        arguments = json.loads(getattr(args, "args", "{}"))
        filters = {
            "state": args.state, "step": args.at, "key": args.key, "error": args.error,
            "q": args.where,
        }  # fmt: skip
        body = {"action": args.action, "filter": filters, **confirmed}
        if args.action != "cancel":
            body |= {"step": args.step, "args": arguments}
        return BulkRunsRequest.model_validate(body)
    except ValueError as exc:  # not JSON, or refused by the request model
        raise CommandError(f"These arguments do not fit: {exc}") from None


def run_bulk(args: argparse.Namespace) -> int:
    """`duly bulk ...`: the dry run, or the apply it confirms; the report on stdout."""
    try:
        body = request_of(args)
        if isinstance(body, BulkReplayRequest):
            app = load_event_app(args, "duly bulk replay")
            url, outbox = app.url, app.tables
        else:
            url, _, _ = app_database(args, "duly bulk")
            outbox = None
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(
        bulk_command, args=args, body=body, tables=outbox, out=sys.stdout, progress=sys.stderr
    )
    return run_until_interrupted(
        url,
        command,
        interrupted=(
            "duly bulk: interrupted; every batch already committed stays done (and is in "
            "duly audit), the rest is untouched."
        ),
    )


async def bulk_command(
    Session: async_sessionmaker[AsyncSession],
    *,
    args: argparse.Namespace,
    body: BulkRunsRequest | BulkReplayRequest,
    tables: Any,
    out: TextIO,
    progress: TextIO,
) -> int:
    """Dry-run or apply `body` on the database, a bar on `progress`, the report on `out`."""
    actor = cli_actor()
    step: Callable[..., Awaitable[dict[str, Any]]]
    async with connect_workflows(Session) as connection:
        try:
            if isinstance(body, BulkReplayRequest):
                step = functools.partial(bulk_replay, connection, tables)
                name = tables.outbox_table.name
            else:
                info = find_workflow(connection, args.workflow)
                step = functools.partial(bulk_runs, connection, info)
                name = info.name
            answer = await step(body, actor, budget=None if body.expected is None else 0.0)
            if answer.get("dry_run"):
                print(json.dumps(answer) if args.json else dry_report(args, name, answer), file=out)
                return 0
            with BatchBar(progress, f"{args.action} {name}", answer["total"]) as bar:
                bar.update(answer["done"], answer["skipped"])
                while answer["next"] is not None:
                    body = body.model_copy(update={"next": answer["next"]})
                    answer = await step(body, actor, budget=0.0)  # a batch a call: the bar moves
                    bar.update(answer["done"], answer["skipped"])
        except (DulyError, InputError) as exc:
            return refused(exc)
    print(json.dumps(answer) if args.json else apply_report(args, name, answer), file=out)
    return 0


def dry_report(args: argparse.Namespace, name: str, answer: dict[str, Any]) -> str:
    """What a dry run prints: the count, the bound, and the command that applies it."""
    held = f", {answer['held']} held by a worker now" if "held" in answer else ""
    rows = "dead letters" if args.action == "replay" else f"{name} runs"
    head = f"duly bulk: a dry run, nothing written. {answer['expected']} {rows} match{held}."
    if not answer["expected"]:
        return head
    confirm = f"--apply --expected {answer['expected']} --upto {shlex.quote(answer['upto'])}"
    return f"{head}\nApply with the same arguments and: {confirm}"


def apply_report(args: argparse.Namespace, name: str, answer: dict[str, Any]) -> str:
    """What an apply prints: rows acted on, skipped, batches, and the bulk's id."""
    skipped = answer["skipped"]
    lines = [
        f"duly bulk {args.action}: {answer['done']} of {answer['total']} in {name} done, "
        f"{skipped} skipped, in {answer['batches']} batches (bulk {answer['bulk_id']}).",
    ]
    if skipped:
        lines.append(
            "  skipped: held by a worker, or changed since the dry run; run the dry run again "
            "for them."
        )
    return "\n".join(lines)
