"""What every `duly` command shares: the command error and the app's database.

`app_database` reads --database-url (else DULY_DATABASE_URL) and imports
DULY_APP; `on_database` runs a command on it and turns a missing table or an
unreachable database into a sentence and an exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from engine import NotFoundError
from engine.base import settings as variables
from engine.base.errors import first_line
from functions.command_line import FAILURE, USAGE_ERROR, put_cwd_on_path
from infra.schema import load_app
from infra.settings import database_url

# A command run on a database: given its session factory, answers the exit status.
DatabaseCommand = Callable[[async_sessionmaker[AsyncSession]], Awaitable[int]]


class CommandError(Exception):
    """A command cannot run as set up; the message says what to change."""


def app_database(args: argparse.Namespace, command: str) -> tuple[str, str, list[Any]]:
    """The database URL (--database-url, else DULY_DATABASE_URL), DULY_APP and the metadata
    of its tables (imported now); CommandError if it cannot."""
    given: str | None = args.database_url
    raw = given if given is not None else variables.DATABASE_URL.read()
    try:
        url = database_url(raw)
    except ValueError as exc:
        message = (
            str(exc) if given is None else str(exc).replace("DULY_DATABASE_URL", "--database-url")
        )
        raise CommandError(message) from None
    if url is None:
        raise CommandError(
            f"{command} needs the workflow database: pass --database-url or set "
            "DULY_DATABASE_URL (duly db-url prints the one duly dev runs)."
        )
    app_module = variables.APP.read()
    put_cwd_on_path()
    return url, app_module, load_app(app_module)


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


def unreachable(exc: Exception) -> int:
    """Say the database refused or cannot be reached (its first line only); FAILURE."""
    reason = first_line(getattr(exc, "orig", None) or exc, "unknown")
    print(f"duly: the database refused or cannot be reached: {reason}", file=sys.stderr)
    return FAILURE
