"""Loading the application's workflow module and creating its tables.

`duly dev` and tests create the schema with `create_all`; a deployed app uses
its own Alembic migrations, which see the same tables because the engine's
columns are ordinary mapped columns.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import attempt_log_classes, registered_workflows
from infra.schema.app_layout import check_app_layout


def load_app(module_name: str) -> list[MetaData]:
    """Import the app module; the distinct MetaData of the workflows and attempt logs it maps.

    First refuses an app named or laid out so that it would merge with duly's own packages.
    """
    check_app_layout(module_name)
    before = set(mapped_classes())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _names_module(module_name, exc.name):
            raise  # the app imports something missing: its own traceback says what
        raise LookupError(
            f"No module named {module_name!r}: point DULY_APP at the module that maps "
            "your workflows."
        ) from None
    # What the module imports from sibling modules counts too, even when a test imported
    # those siblings (and so mapped their classes) before the module itself was loaded.
    exported = {id(value) for value in vars(module).values()}
    return distinct_metadata(
        cls.__table__.metadata
        for cls in mapped_classes()
        if cls not in before or _names_module(cls.__module__, module_name) or id(cls) in exported
    )


def distinct_metadata(metadatas: Iterable[MetaData]) -> list[MetaData]:
    """Each MetaData once, in the order first seen (the same object, not an equal one)."""
    found: list[MetaData] = []
    for metadata in metadatas:
        if not any(metadata is known for known in found):
            found.append(metadata)
    return found


async def create_schema(engine: AsyncEngine, metadatas: list[MetaData]) -> None:
    """Create the tables of `metadatas` that do not exist yet, in one transaction."""
    async with engine.begin() as conn:
        for metadata in metadatas:
            await conn.run_sync(metadata.create_all)


def mapped_classes() -> list[type[Any]]:
    """Every workflow and attempt-log class mapped in this process, in mapping order."""
    return [info.cls for info in registered_workflows()] + attempt_log_classes()


def _names_module(name: str, package: str) -> bool:
    """Whether `name` is `package` or a module inside it."""
    return name == package or name.startswith(package + ".")
