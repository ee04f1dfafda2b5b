"""`RunKey`: one run's primary key as typed values, parsed once from its text by a door.

A door reads a key's text (a URL's segment, a body's `key`, `--key`) with
`engine.views.filters.parse_key` into a `RunKey`, which then travels as is:
to a read (`session.get`), to a handle (`Model.by_key`), and into the WHERE
clause and the parameters of the statements that address that one run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, time
from typing import Any

from sqlalchemy import ColumnElement

from engine.base.shown import json_value
from engine.model.registry import WorkflowInfo


@dataclass(frozen=True)
class RunKey:
    """The run of `workflow` whose primary-key columns hold `values`, in the key's order."""

    workflow: str
    values: tuple[Any, ...]

    @property
    def text(self) -> str:
        """The key as its URL spells it: the value, or a JSON list for a composite key."""
        return key_text_of(self.values)

    def where(self, info: WorkflowInfo) -> list[ColumnElement[bool]]:
        """`column == value` on each primary-key column: the WHERE clause of this one run."""
        columns = info.mapper.primary_key
        return [column == value for column, value in zip(columns, self.values, strict=True)]

    def params(self) -> dict[str, Any]:
        """The values as the parameters `duly_key_<i>` of a statement built once per shape."""
        return {f"duly_key_{i}": value for i, value in enumerate(self.values)}


def key_text_of(values: Sequence[Any]) -> str:
    """The URL spelling of a primary key's values."""
    if len(values) == 1:
        value = values[0]
        return value.isoformat() if isinstance(value, date | time) else str(value)
    return json.dumps([json_value(value) for value in values])
