"""Which runs a page shows: `RunFilter`, and the one text language the API, the CLI and the
console write it in.

    parse_filter(info, 'state:failed error:"card declined" amount>=100 since:1h')

A term is `keyword:value` (state, step, waiting, key, error, since) or `column OP value` on
one of the workflow's own columns that leads an index, with OP one of = != < <= > >=; terms
are ANDed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Column, ColumnElement, DateTime, and_, func, literal

from engine.base.errors import DulyError, InvalidArgumentError
from engine.base.settings import MAX_DAYS
from engine.model.registry import ENGINE_COLUMNS, WorkflowInfo
from engine.runs.keys import RunKey
from engine.views.overview import RUN_STATES, state_condition

MAX_FILTER_TEXT = 1000  # characters of a filter's text
KEYWORDS = ("state", "step", "waiting", "key", "error", "since")
# The engine's columns a keyword reads: named as a column, they are pointed to the keyword.
KEYWORD_OF_COLUMN = {"next_step": "step", "waiting_for": "waiting", "last_error": "error"}
OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
# A term: a name, an operator, then a value (quoted with "..." when it holds spaces).
TERM = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)(:|!=|<=|>=|=|<|>)("(?:[^"\\]|\\.)*"|[^\s"]*)')
# A duration: `90s`, `15m`, `1h30m`, `2d`.
DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
RELATIVE = "-"  # a time value `-1h`: that long before the database's clock


@dataclass(frozen=True)
class ColumnCondition:
    """One comparison on a workflow's own indexed column: `amount >= 100`, `created_at > -1h`."""

    column: str
    operator: str  # one of OPERATORS
    value: Any  # typed for the column; a timedelta before now for a relative time

    def clause(self, info: WorkflowInfo) -> ColumnElement[bool]:
        """This comparison as SQL on `info`'s table."""
        column = info.table.c[self.column]
        value = self.value
        right: Any = (
            func.now() - literal(value)
            if isinstance(value, timedelta)
            else literal(value, column.type)
        )
        compared: ColumnElement[bool] = {
            "=": column == right,
            "!=": column != right,
            "<": column < right,
            "<=": column <= right,
            ">": column > right,
            ">=": column >= right,
        }[self.operator]
        return compared


@dataclass(frozen=True)
class RunFilter:
    """Which runs a page shows: any combination, each optional, ANDed."""

    state: str | None = None  # one of RUN_STATES
    step: str | None = None  # the step the run is at (`next_step`)
    waiting: str | None = None  # the step whose event the run waits for (`waiting_for`)
    key: str | None = None  # one run's key, as its URL spells it
    error: str | None = None  # text within `last_error`, any case
    columns: tuple[ColumnCondition, ...] = field(default=())  # on its own indexed columns

    def clauses(self, info: WorkflowInfo, *, walked: bool = False) -> list[ColumnElement[bool]]:
        """The WHERE clauses of this filter on `info`'s table; a DulyError for a bad value.

        `walked`: without the condition a page's walk of its column's index holds already.
        """
        table = info.table
        where: list[ColumnElement[bool]] = []
        if self.state is not None:
            if self.state not in RUN_STATES:
                raise InvalidArgumentError(
                    f"No run state {self.state!r}: use one of {', '.join(RUN_STATES)}."
                )
            where.append(state_condition(table, self.state))
        texts = {"step": self.step, "waiting": self.waiting, "key": self.key, "error": self.error}
        for name, text in texts.items():
            if text is not None and len(text) > MAX_FILTER_TEXT:
                raise InvalidArgumentError(
                    f"The {name} filter is longer than {MAX_FILTER_TEXT} characters."
                )
        if self.step is not None:
            where.append(table.c.next_step == self.step)
        if self.waiting is not None:
            # A run parked on a step's former name (`@step(aliases=...)`) waits for it too.
            found = info.steps.get(self.waiting)
            names = [self.waiting, *(found.aliases if found is not None else ())]
            where.append(table.c.waiting_for.in_(names))
        if self.key is not None:
            where.append(and_(*parse_key(info, self.key).where(info)))
        if self.error:
            where.append(table.c.last_error.icontains(self.error, autoescape=True))
        skipped = self.walked() if walked else None
        where += [c.clause(info) for c in self.columns if c is not skipped]
        return where

    def walked(self) -> ColumnCondition | None:
        """The condition whose column's index a newest page walks: the first that bounds it."""
        return next((c for c in self.columns if c.operator != "!="), None)

    def also(self, other: RunFilter) -> RunFilter:
        """This filter and `other`, ANDed; an InvalidArgumentError if both set one keyword."""
        merged = self
        for name in ("state", "step", "waiting", "key", "error"):
            theirs = getattr(other, name)
            if theirs is None:
                continue
            if getattr(self, name) not in (None, theirs):
                raise InvalidArgumentError(f"The {name} filter is given twice: give it once.")
            merged = replace(merged, **{name: theirs})
        return replace(merged, columns=(*self.columns, *other.columns))


def filterable_columns(info: WorkflowInfo) -> list[str]:
    """The workflow's own columns a filter may compare: those that lead an index (or the key)."""
    table = info.table
    leading: list[Any] = [next(iter(table.primary_key.columns), None)]
    # A partial index holds some rows only: the planner cannot answer a comparison with it.
    whole = [i for i in table.indexes if i.dialect_options["postgresql"]["where"] is None]
    leading += [next(iter(index.expressions), None) for index in whole]
    leading += [
        next(iter(constraint.columns), None)
        for constraint in table.constraints
        if hasattr(constraint, "columns") and constraint is not table.primary_key
    ]
    names = {c.name for c in leading if isinstance(c, Column) and c.table is table}
    return [c.name for c in table.c if c.name in names and c.name not in ENGINE_COLUMNS]


def time_columns(info: WorkflowInfo) -> list[str]:
    """The filterable columns that hold an instant: what `since:` and `-1h` values compare."""
    table = info.table
    return [name for name in filterable_columns(info) if _is_time(table.c[name])]


def parse_filter(info: WorkflowInfo, text: str) -> RunFilter:
    """The filter `text` writes, for `info`'s runs; an InvalidArgumentError naming what is
    allowed when it cannot be read."""
    if len(text) > MAX_FILTER_TEXT:
        raise InvalidArgumentError(f"A filter is at most {MAX_FILTER_TEXT} characters.")
    found: dict[str, str] = {}
    columns: list[ColumnCondition] = []
    at = 0
    while text[at:].strip():
        term = TERM.match(text, at)
        if term is None or not term.group(3):
            shown = text[at:].strip()[:40]
            raise InvalidArgumentError(
                f"Cannot read {shown!r}: write terms as name:value or column>=value, "
                'with "quotes" around a value that holds spaces.'
            )
        at = term.end()
        name, operator, value = term.group(1), term.group(2), _unquoted(term.group(3))
        if name in KEYWORDS:
            if operator not in (":", "="):
                raise InvalidArgumentError(f"{name} takes {name}:value, not {operator}.")
            if name in found:
                raise InvalidArgumentError(f"The {name} filter is given twice: give it once.")
            found[name] = value
        else:
            columns.append(column_condition(info, name, operator, value))
    if "state" in found and found["state"] not in RUN_STATES:
        states = ", ".join(RUN_STATES)
        raise InvalidArgumentError(f"No run state {found['state']!r}: use one of {states}.")
    for keyword in ("step", "waiting"):
        if keyword in found and found[keyword] not in info.steps:
            steps = ", ".join(info.steps)
            raise InvalidArgumentError(
                f"{info.name} has no step {found[keyword]!r}: its steps are {steps}."
            )
    if "since" in found:
        columns.append(since_condition(info, found.pop("since")))
    if "key" in found:
        try:
            parse_key(info, found["key"])  # refused now, as a filter's mistake
        except DulyError as exc:
            raise InvalidArgumentError(str(exc)) from None
    return RunFilter(**found, columns=tuple(columns))


def column_condition(info: WorkflowInfo, name: str, operator: str, text: str) -> ColumnCondition:
    """`name OP text` on one of the workflow's own columns that leads an index, typed."""
    allowed = filterable_columns(info)
    if name in KEYWORD_OF_COLUMN:
        keyword = KEYWORD_OF_COLUMN[name]
        raise InvalidArgumentError(f"{name} is the engine's column: search it with {keyword}:")
    if name not in allowed:
        what = "an indexed column" if name in info.table.c else "a column"
        raise InvalidArgumentError(
            f"{name} is not {what} of {info.name}: filter on {', '.join(KEYWORDS)} or a "
            f"column that leads an index ({', '.join(allowed) or 'none'})."
        )
    operator = "=" if operator == ":" else operator
    column = info.table.c[name]
    if _is_time(column) and text.startswith(RELATIVE):
        return ColumnCondition(name, operator, parse_duration(text[1:]))
    return ColumnCondition(name, operator, typed_value(info, column, text))


def since_condition(info: WorkflowInfo, text: str) -> ColumnCondition:
    """`since:1h`: the workflow's one indexed time column at or after that long ago."""
    times = time_columns(info)
    if len(times) != 1:
        listed = ", ".join(times) or "none"
        raise InvalidArgumentError(
            f"since: needs one indexed time column, and {info.name} has {len(times)} "
            f"({listed}): write column>=-{text} instead."
        )
    return ColumnCondition(times[0], ">=", parse_duration(text))


def parse_duration(text: str) -> timedelta:
    """`1h30m`, `15m`, `2d`, `90s` as a timedelta of at most MAX_DAYS; an InvalidArgumentError
    for anything else (a longer one reaches past the calendars Python and PostgreSQL keep)."""
    found = DURATION.fullmatch(text)
    if not text or found is None:
        raise InvalidArgumentError(
            f"{text[:40]!r} is not a duration: write it as 90s, 15m, 1h, 1h30m or 2d."
        )
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds  # whole seconds: no overflow
    if total > MAX_DAYS * 86_400:
        raise InvalidArgumentError(
            f"{text[:40]!r} is longer than a search reaches back: at most {MAX_DAYS}d."
        )
    return timedelta(seconds=total)


def parse_key(info: WorkflowInfo, key: str) -> RunKey:
    """The primary key as a URL spells it (the text, or a JSON list) as a `RunKey`: the one
    reader of a key's text, for every door."""
    if len(info.mapper.primary_key) == 1:
        return key_of(info, [key])
    try:
        parts = json.loads(key)
    except ValueError:
        parts = None
    return key_of(info, parts)


def key_of(info: WorkflowInfo, parts: Any) -> RunKey:
    """A key's parts (JSON values or text, one a primary-key column) as a `RunKey`; a
    DulyError saying what a key of `info` is when they do not fit."""
    columns = list(info.mapper.primary_key)
    if not isinstance(parts, list | tuple) or len(parts) != len(columns):
        raise DulyError(f"The key of {info.name} has {len(columns)} parts: give a JSON list.")
    values = tuple(typed_value(info, c, part) for c, part in zip(columns, parts, strict=True))
    return RunKey(info.name, values)


def typed_value(info: WorkflowInfo, column: Any, value: Any) -> Any:
    """`value` as `column`'s Python type (ISO text for times: UTC when it names no zone)."""
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return value
    if isinstance(value, kind):
        return value
    if kind is bool:  # bool("false") is True: read the words
        words = {"true": True, "t": True, "1": True, "false": False, "f": False, "0": False}
        if str(value).lower() in words:
            return words[str(value).lower()]
        raise InvalidArgumentError(
            f"{value!r} is not a valid {column.name} for {info.name}: expected true or false."
        )
    try:
        parse = getattr(kind, "fromisoformat", kind)
        typed = parse(value if isinstance(value, str) else str(value))
    except (TypeError, ValueError, ArithmeticError):
        expected = f"expected {kind.__name__}"
        if kind is datetime:
            expected += " (ISO 8601, e.g. 2026-12-01 or 2026-12-01T09:30, or -1h for an hour ago)"
        elif kind is date:
            expected += " (ISO 8601, e.g. 2026-12-01)"
        raise InvalidArgumentError(
            f"{value!r} is not a valid {column.name} for {info.name}: {expected}."
        ) from None
    if isinstance(typed, datetime) and typed.tzinfo is None and column.type.timezone:
        typed = typed.replace(tzinfo=UTC)
    return typed


def _is_time(column: Any) -> bool:
    return isinstance(column.type, DateTime)


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value
