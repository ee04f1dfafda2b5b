"""`duly prune`: count, per table, what is past its retention period (`engine.retention`,
DULY_RETAIN_*_DAYS); delete it with `--apply`, a short transaction a batch.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from datetime import UTC
from typing import TextIO

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import Batch, PruneResult, RetentionSettings, count_prunable, open_connection, prune
from functions.cli.common import (
    SET_UP_ERRORS,
    Commands,
    add_database_url,
    app_database,
    run_until_interrupted,
    set_up_refused,
)
from functions.cli.progress import BatchBar


def add_prune(commands: Commands) -> None:
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


def run_prune(args: argparse.Namespace) -> int:
    """`duly prune`: count, per table, what is past its retention period; delete it with --apply."""
    try:
        settings = RetentionSettings.from_env()
        if args.older_than_days is not None:
            settings = settings.with_days(args.older_than_days)
        url, _, _ = app_database(args, "duly prune")
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(
        prune_database, settings=settings, apply=args.apply, as_json=args.json, out=sys.stdout
    )
    return run_until_interrupted(
        url,
        command,
        interrupted=(
            "duly prune: interrupted; every batch already committed stays deleted, "
            "the rest is untouched."
        ),
    )


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
        with BatchBar(sys.stderr, "pruning") as bar:

            async def show(batch: Batch) -> None:
                bar.update(batch.rows, note=f"rows deleted, {batch.batches} batches")

            result = await prune(connection, settings, on_batch=show)
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
        period = f"{t.days} days" if t.days else "expired"  # the seen signatures: no period
        cutoff = f"{t.cutoff.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({period})"
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
