"""Writes to runs from outside: start one, deliver an event, run a step now, cancel.

The request models are the bodies of `POST /workflows/{name}/...`, the
console's forms and the Lambda `deliver` event alike. Runs are named by
their key (parsed as URLs spell it) or by `where` on the workflow's own
columns, each value checked as JSON against its column's type; the
engine's columns (`next_step`, `wake_at`, ...) and JSON columns cannot
be matched. A step's arguments are checked against its annotations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    create_model,
)
from sqlalchemy import ColumnElement
from sqlalchemy.exc import IntegrityError
from sqlalchemy.types import JSON

from engine import (
    ENGINE_COLUMNS,
    AuditActor,
    Call,
    Delivery,
    DulyError,
    RunKey,
    Step,
    StepError,
    WorkflowInfo,
    cancel_recorded,
    first_line,
    key_of,
    key_text,
    parse_key,
    run_recorded,
    start_recorded,
)
from functions.requests.errors import (
    ConflictError,
    InputError,
    Place,
    Problem,
    RowRefusedError,
    from_validation,
)
from functions.requests.lookup import StepName, find_entry_step, find_step
from functions.requests.nesting import JsonObject, check_nesting

MAX_IDEMPOTENCY_KEY = 200  # characters
# A key in a body: the value of a one-column primary key, or a list for a composite one.
BodyKey = StrictInt | StrictStr | list[StrictInt | StrictStr]
Model = TypeVar("Model", bound=BaseModel)
NAME_THE_RUNS = "Name the runs with key (the run's primary key) or where, one of them, not both."


class StartRequest(BaseModel):
    """A new run: its row's columns (by column name), its first step and that step's arguments."""

    model_config = ConfigDict(extra="forbid")
    row: JsonObject = Field(default_factory=dict)
    step: StepName
    args: JsonObject = Field(default_factory=dict)


class Addressed(BaseModel):
    """Which runs: `key` (a list for a composite key), or `where` {column: value}."""

    model_config = ConfigDict(extra="forbid")
    key: BodyKey | None = None
    where: JsonObject | None = None


class CancelRequest(Addressed):
    """The runs to end where they stand."""


class RunRequest(Addressed):
    """The runs to run a step on now, replacing what they had scheduled."""

    step: StepName
    args: JsonObject = Field(default_factory=dict)


class DeliverRequest(RunRequest):
    """An event for the runs waiting on `step`; a repeated `idempotency_key` is refused."""

    idempotency_key: Annotated[str, Field(min_length=1, max_length=MAX_IDEMPOTENCY_KEY)] | None = (
        None
    )
    restart: StrictBool = False


def parse_body(model: type[Model], body: Any) -> Model:
    """`body` (a decoded JSON object) as `model`; an InputError naming each refused value."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc) from None


# -- a step's call --------------------------------------------------------------------------


def build_call(step: Step[Any, Any], args: dict[str, Any]) -> Call[Any]:
    """The call of `step` with `args` by name; a StepError when they do not fit.

    The StepError is raised from an InputError placing each refusal under
    `args`, which the doors that show places (HTTP, the console) read.
    """
    check_nesting(args, "args")
    try:
        step.arguments.validate(args)
    except ValidationError as exc:
        placed = from_validation(exc, "args")
    except ValueError:  # NaN or Infinity: JSON has neither
        placed = InputError.at(("args",), "Arguments must be JSON: no NaN or Infinity.")
    else:
        return step.call_named(args)
    raise StepError(f"Step {step.qualname} does not accept these arguments: {placed}") from placed


# -- a workflow's own columns ---------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Columns:
    """A workflow's own columns (not the engine's), checked as JSON like step arguments."""

    model: type[BaseModel]  # the row a start inserts, by column name
    keys: dict[str, str]  # column name -> attribute key
    adapters: dict[str, TypeAdapter[Any]]  # column name -> one value, or null


@lru_cache(maxsize=256)
def columns_of(info: WorkflowInfo) -> Columns:
    """The pydantic model of a workflow's columns, built once per table.

    A column is required when it is NOT NULL with no default of either kind
    and is not the autoincrementing key; JSON columns take any JSON.
    """
    fields: dict[str, Any] = {}
    keys: dict[str, str] = {}
    adapters: dict[str, TypeAdapter[Any]] = {}
    strict = ConfigDict(strict=True)
    for number, column in enumerate(c for c in info.table.c if c.name not in ENGINE_COLUMNS):
        kind = _python_type(column)
        required = not (
            column.nullable
            or column.default is not None
            or column.server_default is not None
            or column is info.table.autoincrement_column
        )
        hint: Any = kind | None if column.nullable and kind is not Any else kind
        fields[f"c{number}"] = (hint, Field(... if required else None, alias=column.name))
        keys[column.name] = info.mapper.get_property_by_column(column).key
        adapters[column.name] = TypeAdapter(kind | None if kind is not Any else Any, config=strict)
    model = create_model(
        f"{info.cls.__name__}_row", __config__=ConfigDict(strict=True, extra="forbid"), **fields
    )
    return Columns(model, keys, adapters)


def _python_type(column: Any) -> Any:
    """The Python type a column's values take, or Any when there is none pydantic can check."""
    if isinstance(column.type, JSON):
        return Any
    try:
        kind = column.type.python_type
        TypeAdapter(kind)
    except Exception:  # NotImplementedError, or no schema for the type: unchecked
        return Any
    return kind


def row_values(info: WorkflowInfo, row: dict[str, Any]) -> dict[str, Any]:
    """The row's values by attribute key, parsed from JSON; an InputError for what does not fit."""
    columns = columns_of(info)
    try:
        parsed = columns.model.model_validate_json(json.dumps(row, allow_nan=False))
    except ValidationError as exc:
        raise from_validation(exc, "row") from None
    except ValueError:
        raise InputError.at(("row",), "The row must be JSON: no NaN or Infinity.") from None
    given = parsed.model_dump(by_alias=True, exclude_unset=True)
    return {columns.keys[name]: value for name, value in given.items()}


# -- which runs -----------------------------------------------------------------------------


def run_key(info: WorkflowInfo, key: Any) -> RunKey:
    """A body's key (the value, or a list for a composite key) as a `RunKey`; an InputError
    placed at `key` when it is not one of `info`'s."""
    try:
        return key_of(info, key if isinstance(key, list) else [key])
    except DulyError as exc:
        raise InputError.at(("key",), str(exc)) from None


def url_key(info: WorkflowInfo, text: str, place: Place = ("key",)) -> RunKey:
    """A key as a URL or a command's `KEY` spells it as a `RunKey`; an InputError (422) placed
    at `place` when it is not one of `info`'s."""
    try:
        return parse_key(info, text)
    except DulyError as exc:
        raise InputError.at(place, str(exc)) from None


def runs_addressed(
    info: WorkflowInfo, body: Addressed, key: RunKey | None = None
) -> RunKey | list[ColumnElement[bool]]:
    """The one run of `key` or of the body's `key`, or the WHERE clause of its `where`;
    exactly one is given (`key` by a door whose URL names the run)."""
    given = [found for found in (key, body.key, body.where) if found is not None]
    if len(given) != 1:
        raise InputError.at((), NAME_THE_RUNS)
    if key is not None:
        return key
    if body.key is not None:
        return run_key(info, body.key)
    assert body.where is not None
    if not body.where:
        raise InputError.at(("where",), "where needs a column: it would address every run.")
    columns = columns_of(info)
    clauses: list[ColumnElement[bool]] = []
    for name, value in body.where.items():
        clauses.append(_matched(info, columns, name, value))
    return clauses


def _matched(info: WorkflowInfo, columns: Columns, name: str, value: Any) -> ColumnElement[bool]:
    """`column = value` (or IS NULL) for one entry of `where`."""
    place = ("where", name)
    if name in ENGINE_COLUMNS and name in info.table.c:
        message = f"{name} is one of the engine's columns: address runs by {info.name}'s own."
        raise InputError.at(place, message)
    adapter = columns.adapters.get(name)
    if adapter is None:
        raise InputError.at(place, f"{info.name} has no column {name!r}.")
    column = info.table.c[name]
    if isinstance(column.type, JSON):  # json has no = in PostgreSQL
        raise InputError.at(place, f"{name} is JSON: it cannot be matched.")
    try:
        typed = adapter.validate_json(json.dumps(value, allow_nan=False))
    except ValidationError as exc:
        raise from_validation(exc, *place) from None
    except ValueError:
        raise InputError([Problem(place, "No NaN or Infinity in JSON.")]) from None
    return column.is_(None) if typed is None else column == typed


# -- the writes -----------------------------------------------------------------------------


async def start_run(info: WorkflowInfo, body: StartRequest, *, actor: AuditActor) -> dict[str, Any]:
    """Insert a run and its first step, recording `actor`; ConflictError when a unique key
    already has a run."""
    call = build_call(find_entry_step(info, body.step), body.args)
    row = info.cls(**row_values(info, body.row))
    try:
        started = await start_recorded(info, row, call, actor)
    except IntegrityError as exc:  # NOT NULL, CHECK or a foreign key: the row's values
        reason = first_line(exc.orig, "refused")
        raise RowRefusedError(f"The database refused this {info.name} row: {reason}") from None
    if not started:
        raise ConflictError(
            f"A {info.name} run with one of these unique values exists: none was started."
        )
    return {"workflow": info.name, "key": key_text(info, row), "step": call.step.name}


async def deliver_event(
    info: WorkflowInfo, body: DeliverRequest, key: RunKey | None = None
) -> Delivery:
    """Deliver an event to the addressed runs (`key`'s, when the door's URL names it); how
    many took it now, how many hold it until they wait, and the others' refusals by reason."""
    call = build_call(find_step(info, body.step), body.args)
    addressed = runs_addressed(info, body, key)
    if isinstance(addressed, RunKey):
        handle = info.cls.by_key(addressed)
    else:
        handle = info.cls.by(*addressed)
    delivered: Delivery = await handle.deliver(call, key=body.idempotency_key, restart=body.restart)
    return delivered


def delivery_answer(info: WorkflowInfo, delivered: Delivery) -> dict[str, Any]:
    """What every door answers for a delivery: `taken` (now), `held` (until the run waits),
    their sum `accepted`, `refused` by reason, and a sentence that says them."""
    return {"workflow": info.name, **delivered.to_dict()}


async def run_step(
    info: WorkflowInfo, body: RunRequest, *, actor: AuditActor, key: RunKey | None = None
) -> int:
    """Run a step now on the addressed runs (`key`'s, when the door's URL names it),
    replacing what was scheduled, recording `actor`; how many."""
    call = build_call(find_step(info, body.step), body.args)
    where = where_of(info, runs_addressed(info, body, key))
    return await run_recorded(info, where, call, actor, addressed_subject(body, key))


async def cancel_runs(
    info: WorkflowInfo, body: CancelRequest, *, actor: AuditActor, key: RunKey | None = None
) -> int:
    """End the addressed runs where they stand (`key`'s, when the door's URL names it),
    recording `actor`; how many were live."""
    where = where_of(info, runs_addressed(info, body, key))
    return await cancel_recorded(info, where, actor, addressed_subject(body, key))


def where_of(
    info: WorkflowInfo, addressed: RunKey | list[ColumnElement[bool]]
) -> list[ColumnElement[bool]]:
    """The WHERE clause of what `runs_addressed` answered."""
    return addressed.where(info) if isinstance(addressed, RunKey) else addressed


def addressed_subject(body: Addressed, key: RunKey | None = None) -> dict[str, Any]:
    """Which runs a request addressed, as the audit's subject: its key (as the body gave it,
    or `key` as its URL spells it) or its `where`."""
    if body.key is not None:
        return {"key": body.key}
    return {"key": key.text} if key is not None else {"where": body.where}
