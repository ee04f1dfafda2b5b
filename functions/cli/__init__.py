"""The `duly` command: `duly dev` runs the app, a worker and PostgreSQL on this machine.

`duly dev`, `db-url` and `version` (develop), `drain` and `replay-dead-letters`
(outbox), `status`, `runs` and `show` (runs), `prune`, `migrate`, `init` and the
others: each module declares its commands (`add_*`) beside their handlers; the
parser gathers them and `main` runs one (parser); what they share (common,
output). `duly --help` lists every command and its options.
"""

from __future__ import annotations

from functions.cli.common import CommandError
from functions.cli.parser import build_parser, main
from functions.command_line import FAILURE, INTERRUPTED, USAGE_ERROR, put_cwd_on_path

__all__ = [
    "FAILURE",
    "INTERRUPTED",
    "USAGE_ERROR",
    "CommandError",
    "build_parser",
    "main",
    "put_cwd_on_path",
]
