"""Stored values as a read shows them: JSON types only, nested at most SHOWN_NESTING levels.

What is stored may nest deeper than any read can walk (a row written before
the request layer bounded JSON, or by SQL). A read shows such a value down
to SHOWN_NESTING levels and each deeper array or object as TRUNCATED; both
walks here are iterative, so no stored value can exhaust Python's stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date, time, timedelta
from typing import Any

SHOWN_NESTING = 64  # levels of arrays and objects a read shows; deeper ones are TRUNCATED
TRUNCATED = "…"  # what a read shows in place of an array or object nested deeper


def json_value(value: Any) -> Any:
    """A value as JSON holds it: times in ISO 8601, other non-JSON types as their text.

    Arrays and objects nested deeper than SHOWN_NESTING levels are TRUNCATED.
    """
    return _bounded(value, scalar_value)


def bounded_value(value: Any) -> Any:
    """`value` with its arrays and objects nested deeper than SHOWN_NESTING levels TRUNCATED."""
    return _bounded(value, lambda scalar: scalar)


def _bounded(value: Any, shown_as: Callable[[Any], Any]) -> Any:
    root: list[Any] = [None]
    # (the value, the container its result goes in, the slot there, its depth)
    pending: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
    while pending:
        item, into, slot, depth = pending.pop()
        if isinstance(item, dict | list | tuple) and depth >= SHOWN_NESTING:
            into[slot] = TRUNCATED
        elif isinstance(item, dict):
            shown: dict[str, Any] = dict.fromkeys(str(k) for k in item)
            into[slot] = shown
            pending.extend((v, shown, str(k), depth + 1) for k, v in item.items())
        elif isinstance(item, list | tuple):
            listed: list[Any] = [None] * len(item)
            into[slot] = listed
            pending.extend((v, listed, i, depth + 1) for i, v in enumerate(item))
        else:
            into[slot] = shown_as(item)
    return root[0]


def scalar_value(value: Any) -> Any:
    """One value that holds no others, as JSON holds it."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


def loads_shown(text: str | None) -> Any:
    """Stored JSON text decoded, its arrays and objects past SHOWN_NESTING levels TRUNCATED."""
    if text is None:
        return None
    return json.loads(truncated_text(text))


def truncated_text(text: str) -> str:
    """JSON text with each array or object nested past SHOWN_NESTING levels as TRUNCATED."""
    kept: list[str] = []
    depth = 0
    start = 0  # where the text kept next begins
    in_string = escaped = False
    for at, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth == SHOWN_NESTING + 1:  # the first level not shown: cut from here
                kept.append(text[start:at])
        elif char in "]}":
            if depth == SHOWN_NESTING + 1:
                kept.append(json.dumps(TRUNCATED))
                start = at + 1
            depth -= 1
    if depth > SHOWN_NESTING:
        return text  # not JSON as stored JSON is: json.loads says what is wrong
    kept.append(text[start:])
    return "".join(kept)
