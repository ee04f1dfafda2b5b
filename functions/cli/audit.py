"""`duly audit`: the newest actions people took (`duly_audit`), who, through which door, on what."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from typing import TextIO

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import AuditEntry, DulyError, recent_actions
from functions.cli.common import (
    SET_UP_ERRORS,
    Commands,
    add_database_url,
    app_database,
    on_database,
    set_up_refused,
)
from functions.cli.output import aligned, refused

DEFAULT_SHOWN = 50  # records `duly audit` prints by default
SUBJECT_SHOWN = 60  # characters of a subject's JSON in the table


def add_audit(commands: Commands) -> None:
    """`duly audit` and its options."""
    audit = commands.add_parser("audit", help="the newest actions people took, who and how")
    add_database_url(audit)
    audit.add_argument("--workflow", help="only actions on this workflow table")
    audit.add_argument(
        "--limit", type=int, default=DEFAULT_SHOWN, help=f"records (default {DEFAULT_SHOWN})"
    )
    audit.add_argument("--json", action="store_true", help="print JSON, for scripts")
    audit.set_defaults(command=run_audit)


def run_audit(args: argparse.Namespace) -> int:
    """`duly audit`: the trail, newest first, as a table or JSON."""
    try:
        url, _, _ = app_database(args, "duly audit")
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(
        print_audit, workflow=args.workflow, limit=args.limit, as_json=args.json, out=sys.stdout
    )
    return asyncio.run(on_database(url, command))


async def print_audit(
    Session: async_sessionmaker[AsyncSession],
    *,
    workflow: str | None,
    limit: int,
    as_json: bool,
    out: TextIO,
) -> int:
    """Read the newest records and print them."""
    try:
        async with Session() as session:
            entries = await recent_actions(session, workflow=workflow, limit=limit)
    except DulyError as exc:
        return refused(exc)
    if as_json:
        print(json.dumps([entry.to_dict() for entry in entries], indent=2), file=out)
    elif not entries:
        print(
            "duly audit: no action recorded" + (f" on {workflow}." if workflow else "."), file=out
        )
    else:
        print(audit_table(entries), file=out)
    return 0


def audit_table(entries: list[AuditEntry]) -> str:
    """The records as aligned columns, newest first."""
    lines = [["at", "actor", "via", "action", "workflow", "count", "subject"]]
    for entry in entries:
        subject = json.dumps(entry.subject)
        if len(subject) > SUBJECT_SHOWN:
            subject = subject[: SUBJECT_SHOWN - 1] + "…"
        count = "-" if entry.count is None else str(entry.count)
        at = f"{entry.at:%Y-%m-%d %H:%M:%S}"
        lines.append(
            [at, entry.actor, entry.via, entry.action, entry.workflow or "-", count, subject]
        )
    return aligned(lines, right={5})
