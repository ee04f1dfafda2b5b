"""The classes mapped with a mixin, found by walking its subclasses rather than kept in a list.

A list filled at class creation would be process-wide state; Python already
keeps each class's subclasses (weakly), in the order they were made.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table


def mapped_subclasses(mixin: type[Any]) -> list[type[Any]]:
    """Every subclass of `mixin` that maps a table of its own, the earliest made first."""
    found: list[type[Any]] = []
    seen: set[type[Any]] = set()
    pending = list(reversed(mixin.__subclasses__()))
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if isinstance(cls.__dict__.get("__table__"), Table):
            found.append(cls)
        pending.extend(reversed(cls.__subclasses__()))
    return found
