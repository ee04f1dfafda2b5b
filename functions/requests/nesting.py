"""How deep a request's JSON may nest, checked by every door through the request models.

`JsonObject` is the type of each free-form JSON field of the request models
(an event's payload and metadata, a step's args, a run's row and where);
`bounded_design` checks a graph design as a whole. The walk is iterative,
so a value nested past Python's recursion limit is refused, not a crash.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError

from engine import SHOWN_NESTING, Design
from functions.requests.errors import InputError, Place, spelled

# Levels of arrays and objects inside one another in one JSON value: the levels a read shows,
# so whatever a door takes reads back whole.
MAX_NESTING = SHOWN_NESTING
TOO_DEEP = f"JSON may nest arrays and objects at most {MAX_NESTING} levels deep."


def too_deep_at(value: Any) -> Place | None:
    """Where `value` first nests past MAX_NESTING levels (its path), or None when it does not."""
    pending: list[tuple[Any, Place]] = [(value, ())]
    while pending:
        item, place = pending.pop()
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list | tuple):
            children = enumerate(item)
        else:
            continue
        if len(place) >= MAX_NESTING:
            return place
        pending.extend((child, (*place, key)) for key, child in children)
    return None


def check_nesting(value: Any, *prefix: str | int) -> None:
    """An InputError at `prefix` when `value` nests past MAX_NESTING levels."""
    if too_deep_at(value) is not None:
        raise InputError.at(prefix, TOO_DEEP)


def _bounded(value: Any) -> Any:
    if too_deep_at(value) is not None:
        raise PydanticCustomError("json_too_deep", TOO_DEEP)
    return value


def _bounded_design(value: Any) -> Any:
    """A design's body as sent, refused before its models read it when it nests too deep."""
    place = too_deep_at(value)
    if place is not None:
        where = spelled(place[:2])  # the node or connection that holds it
        raise PydanticCustomError("json_too_deep", f"{where}: {TOO_DEEP}" if where else TOO_DEEP)
    return value


# A free-form JSON object of a request: any JSON, nested at most MAX_NESTING levels.
JsonObject = Annotated[dict[str, Any], AfterValidator(_bounded)]
# A graph design's body (`POST /graphs/templates`, the designer's save).
DesignBody = Annotated[Design, BeforeValidator(_bounded_design)]
