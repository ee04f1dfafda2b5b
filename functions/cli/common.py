"""What every `duly` command shares: the command error, the app and its database.

`app_database` finds the database (`command_database_url`: --database-url, else
DULY_DATABASE_URL, else the `duly dev` running here) and imports DULY_APP
(`load_command_app`); `on_database` runs a command on it and turns a missing
table or an unreachable database into a sentence and an exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from engine import NotFoundError, first_line, settings as variables
from functions.cli.develop import LOCAL_EXTRA
from functions.command_line import (
    FAILURE,
    INTERRUPTED,
    USAGE_ERROR,
    put_cwd_on_path,
    say_when_examples_serve,
)
from functions.requests.errors import InputError
from functions.requests.runs import parse_body
from infra.schema import load_app
from infra.settings import data_dir, database_url

# A command run on a database: given its session factory, answers the exit status.
DatabaseCommand = Callable[[async_sessionmaker[AsyncSession]], Awaitable[int]]
# The `duly` parser's subcommands: each command module's `add_*` declares its own on them.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Body = TypeVar("Body", bound=BaseModel)
DEV_DATABASE_DEFAULT = "DULY_DATABASE_URL, else that of the duly dev running here"


class CommandError(Exception):
    """A command cannot run as set up; the message says what to change."""


# What a command's set-up (its arguments, DULY_APP, the database URL) raises for the
# caller to change: said in a sentence, a usage error, never a traceback.
SET_UP_ERRORS = (ValueError, LookupError, CommandError)


def add_database_url(parser: argparse.ArgumentParser, default: str = DEV_DATABASE_DEFAULT) -> None:
    """The --database-url option of the commands that work on any database."""
    parser.add_argument("--database-url", help=f"the workflow database (default: {default})")


def set_up_refused(exc: Exception) -> int:
    """Say why a command cannot run as set up (one of SET_UP_ERRORS); USAGE_ERROR."""
    print(f"duly: {exc}", file=sys.stderr)
    return USAGE_ERROR


def app_database(args: argparse.Namespace, command: str) -> tuple[str, str, list[Any]]:
    """The database URL (`command_database_url`), DULY_APP and the metadata of its tables
    (imported now, `load_command_app`); CommandError if it cannot."""
    url = command_database_url(args.database_url, command)
    app_module, metadatas = load_command_app()
    return url, app_module, metadatas


def command_database_url(given: str | None, command: str) -> str:
    """--database-url (`given`), else DULY_DATABASE_URL, else the database of the `duly dev`
    running from here; CommandError naming all three when there is none."""
    url = configured_database_url(given)
    if url is None:
        url = running_dev_database_url()
    if url is None:
        raise CommandError(
            f"{command} needs the workflow database: pass --database-url or set "
            f"DULY_DATABASE_URL, or start duly dev in this folder (none runs in "
            f"{dev_data_dir()}; it is found by itself)."
        )
    return url


def configured_database_url(given: str | None) -> str | None:
    """--database-url (`given`), else DULY_DATABASE_URL, as duly's URL; None when neither."""
    raw = given if given is not None else variables.DATABASE_URL.read()
    try:
        return database_url(raw)
    except ValueError as exc:
        message = (
            str(exc) if given is None else str(exc).replace("DULY_DATABASE_URL", "--database-url")
        )
        raise CommandError(message) from None


def running_dev_database_url() -> str | None:
    """The database of the `duly dev` running from here, said on stderr; None when none runs."""
    shown = running_dev_database()
    if shown is None:
        return None
    print(
        f"duly: using the database of the duly dev running in {dev_data_dir()}: {shown}",
        file=sys.stderr,
    )
    return database_url(shown)


def running_dev_database() -> str | None:
    """The libpq URL of the `duly dev` database running from here (what `duly db-url`
    prints); None when none runs, or without the local extra to look with."""
    try:
        from infra.embedded import running_postmaster
    except ModuleNotFoundError as exc:
        if exc.name not in LOCAL_EXTRA:
            raise
        return None  # no local extra: no duly dev can run from this installation
    postmaster = running_postmaster(dev_data_dir())
    return None if postmaster is None else postmaster.url


def dev_data_dir() -> Path:
    """Where `duly dev` keeps its embedded PostgreSQL: DULY_DATA_DIR, else .duly/pgdata here."""
    return data_dir(variables.DATA_DIR.read())


def load_command_app() -> tuple[str, list[Any]]:
    """DULY_APP's name and the metadata of its tables, imported now.

    Unset, says on stderr that duly's examples are used; CommandError when the
    module maps no workflow (a command would show empty tables).
    """
    app_module = app_module_named()
    put_cwd_on_path()
    metadatas = load_app(app_module)
    if not metadatas:
        raise CommandError(
            f"{app_module} maps no workflow: point DULY_APP at the module that defines or "
            "imports your Workflow classes."
        )
    return app_module, metadatas


def app_module_named() -> str:
    """DULY_APP; when it is unset, duly's examples, said once on stderr with how to name yours."""
    say_when_examples_serve()
    return variables.APP.read()


async def on_database(url: str, command: DatabaseCommand) -> int:
    """Run `command` (a function of a session factory) on the app's database; its exit status.

    A missing table is a usage error, an unreachable database a failure:
    each a sentence, never a traceback.
    """
    engine = create_async_engine(url)
    try:
        return await command(async_sessionmaker(engine, expire_on_commit=False))
    except NotFoundError as exc:
        print(f"duly: {exc} Create the app's tables first.", file=sys.stderr)
        return USAGE_ERROR
    except (SQLAlchemyError, OSError) as exc:
        return unreachable(exc)
    finally:
        await engine.dispose()


def run_until_interrupted(url: str, command: DatabaseCommand, *, interrupted: str) -> int:
    """Run `command` on the database (`on_database`) to its end; its exit status.

    Ctrl-C prints `interrupted` (what stays done, what is left) and exits INTERRUPTED:
    a long command's batches already committed, never a traceback.
    """
    try:
        return asyncio.run(on_database(url, command))
    except KeyboardInterrupt:
        print(f"\n{interrupted}", file=sys.stderr)
        return INTERRUPTED


def unreachable(exc: Exception) -> int:
    """Say the database refused or cannot be reached (its first line only); FAILURE."""
    reason = first_line(getattr(exc, "orig", None) or exc, "unknown")
    print(f"duly: the database refused or cannot be reached: {reason}", file=sys.stderr)
    return FAILURE


def command_body(
    model: type[Body], args: argparse.Namespace, document: dict[str, Any], *given: str
) -> Body:
    """The request body the options spell (`given` options read as JSON objects); a
    ValueError naming what is not JSON or what the request layer refuses."""
    for option in given:
        text = getattr(args, option)
        try:
            document[option] = json.loads(text)
        except ValueError:
            raise ValueError(f"--{option} is not JSON: {text[:80]!r}.") from None
    try:
        return parse_body(model, document)
    except InputError as exc:
        raise ValueError(str(exc)) from None
