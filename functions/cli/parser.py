"""The `duly` command line: its parser, and `main`, which runs the command chosen.

Each command module declares its own commands (`add_*`: their options and their
handler); this module only gathers them, in the order `duly --help` lists them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from functions.cli.audit import add_audit
from functions.cli.bulk import add_bulk
from functions.cli.common import Commands
from functions.cli.deliver import add_deliver
from functions.cli.develop import add_dev, add_version
from functions.cli.init import add_init
from functions.cli.keys import add_keys
from functions.cli.migrate import add_migrate
from functions.cli.outbox import add_outbox
from functions.cli.prune import add_prune
from functions.cli.runs import add_runs
from functions.cli.schedules import add_schedules
from functions.cli.start import add_start

# Every command group's declaration, in the order `duly --help` lists them.
COMMAND_GROUPS: tuple[Callable[[Commands], None], ...] = (
    add_dev,  # dev, db-url
    add_outbox,  # drain, replay-dead-letters
    add_runs,  # status, runs, show
    add_schedules,
    add_start,
    add_deliver,
    add_prune,
    add_bulk,
    add_audit,
    add_migrate,
    add_keys,
    add_init,
    add_version,
)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `duly` console script."""
    args = build_parser().parse_args(argv)
    sys.exit(args.command(args))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `duly` and its subcommands."""
    parser = argparse.ArgumentParser(prog="duly", description="Durable workflows on PostgreSQL.")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    for add in COMMAND_GROUPS:
        add(commands)
    return parser
