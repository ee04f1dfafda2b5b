"""Bulk actions from outside: every run (or dead letter) a filter matches, a dry run first.

A body without `expected` is a dry run: it answers the count and the highest key
(`upto`). The same body with `expected` and `upto` applies, for at most `budget`
seconds; an answer with `next` goes on when that is sent back with the same body.
Every door (HTTP, the console, the CLI) calls these, each naming its actor and door.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from engine import (
    MAX_FILTER_TEXT,
    AuditActor,
    BulkCancel,
    BulkChangedError,
    BulkProgress,
    BulkRun,
    DeadLetterFilter,
    DulyError,
    EventTables,
    InvalidArgumentError,
    RunAction,
    RunFilter,
    WorkflowConnection,
    WorkflowInfo,
    apply_replay,
    apply_runs,
    parse_filter,
    parse_key,
    plan_replay,
    plan_runs,
    resume_replay,
    resume_runs,
    start_replay,
    start_runs,
)
from functions.requests.errors import ConflictError, InputError
from functions.requests.lookup import StepName, find_step
from functions.requests.nesting import JsonObject
from functions.requests.runs import build_call

BUDGET = 5.0  # seconds an apply goes on before it answers its progress and `next`
MAX_CONTINUATION = 4000  # characters of a `next`
FilterText = Annotated[StrictStr, Field(max_length=MAX_FILTER_TEXT)] | None
Continuation = Annotated[StrictStr, Field(min_length=1, max_length=MAX_CONTINUATION)] | None
Count = Annotated[StrictInt, Field(ge=0)] | None


class RunFilterBody(BaseModel):
    """Which runs: a state, the step they are at, one key, text within their error, and a
    search in the runs pages' language (`q`), all ANDed."""

    model_config = ConfigDict(extra="forbid")
    state: FilterText = None
    step: FilterText = None
    key: FilterText = None
    error: FilterText = None
    q: FilterText = None


class Confirmed(BaseModel):
    """A dry run's answer confirmed (`expected`, `upto`), or an apply's `next` to go on."""

    model_config = ConfigDict(extra="forbid")
    expected: Count = None
    upto: FilterText = None
    next: Continuation = None


class BulkRunsRequest(Confirmed):
    """Run a step on the matching runs (`retry`: on the failed ones), or cancel them."""

    action: Literal["run", "retry", "cancel"]
    filter: RunFilterBody = Field(default_factory=RunFilterBody)
    step: StepName | None = None
    args: JsonObject = Field(default_factory=dict)


class DeadLetterFilterBody(BaseModel):
    """Which dead letters: the event's name, a dead route's handler or digest, error text."""

    model_config = ConfigDict(extra="forbid")
    event_name: FilterText = None
    route: FilterText = None
    error: FilterText = None


class BulkReplayRequest(Confirmed):
    """Replay the dead letters that match."""

    filter: DeadLetterFilterBody = Field(default_factory=DeadLetterFilterBody)


def run_filter(info: WorkflowInfo, given: RunFilterBody) -> RunFilter:
    """The one place a bulk action's filter is built from what a door was given: the fields,
    and the search `q` (`engine.views.filters`), ANDed."""
    fields = RunFilter(
        state=given.state or None,
        step=given.step or None,
        key=given.key or None,
        error=given.error or None,
    )
    search = (given.q or "").strip()
    if not search:
        return fields
    try:
        return parse_filter(info, search).also(fields)
    except InvalidArgumentError as exc:
        raise InputError.at(("filter", "q"), str(exc)) from None


def runs_filter_of(info: WorkflowInfo, body: BulkRunsRequest) -> RunFilter:
    """The filter of a body; `retry` means the failed runs (another state is refused)."""
    filters = run_filter(info, body.filter)
    if body.action == "retry":
        if filters.state not in (None, "failed"):
            raise InputError.at(("filter", "state"), "retry acts on the failed runs only.")
        filters = replace(filters, state="failed")
    return filters


def run_action(info: WorkflowInfo, body: BulkRunsRequest) -> RunAction:
    """What a body does to each run."""
    if body.action == "cancel":
        if body.step is not None or body.args:
            raise InputError.at(("step",), "cancel takes no step and no arguments.")
        return BulkCancel()
    if body.step is None:
        raise InputError.at(("step",), f"{body.action} needs the step to run.")
    return BulkRun(build_call(find_step(info, body.step), body.args), retry=body.action == "retry")


async def bulk_runs(
    connection: WorkflowConnection,
    info: WorkflowInfo,
    body: BulkRunsRequest,
    actor: AuditActor,
    *,
    budget: float | None,
) -> dict[str, Any]:
    """A dry run's plan, or an apply's progress after at most `budget` seconds of batches."""
    filters = runs_filter_of(info, body)
    action = run_action(info, body)
    try:
        if body.next is not None:
            progress = resume_runs(info, filters, action, body.next)
        elif body.expected is None:
            return {**(await plan_runs(connection, info, filters)).to_dict(), "action": body.action}
        else:
            upto = None if body.upto is None else info_key(info, body.upto)
            progress = await start_runs(
                connection, info, filters, action, expected=body.expected, upto=upto
            )
        batches = apply_runs(connection, info, filters, action, progress, actor)
        progress = await within(batches, progress, budget)
    except BulkChangedError as exc:
        raise ConflictError(str(exc)) from None
    return {"workflow": info.name, **progress.to_dict()}


def info_key(info: WorkflowInfo, upto: str) -> tuple[Any, ...]:
    """A dry run's `upto`, as the key's typed values; an InputError when it is not a key."""
    try:
        return parse_key(info, upto).values
    except DulyError as exc:
        raise InputError.at(("upto",), str(exc)) from None


async def bulk_replay(
    connection: WorkflowConnection,
    tables: EventTables,
    body: BulkReplayRequest,
    actor: AuditActor,
    *,
    budget: float | None,
) -> dict[str, Any]:
    """A dry run's plan, or a replay's progress after at most `budget` seconds of batches."""
    given = body.filter
    filters = DeadLetterFilter(
        event_name=given.event_name or None, route=given.route or None, error=given.error or None
    )
    try:
        if body.next is not None:
            progress = resume_replay(tables, filters, body.next)
        elif body.expected is None:
            return (await plan_replay(connection, tables, filters)).to_dict()
        else:
            progress = await start_replay(
                connection, tables, filters, expected=body.expected, upto=body.upto
            )
        batches = apply_replay(connection, tables, filters, progress, actor)
        progress = await within(batches, progress, budget)
    except BulkChangedError as exc:
        raise ConflictError(str(exc)) from None
    return {"outbox": tables.outbox_table.name, **progress.to_dict()}


async def within(
    batches: AsyncGenerator[BulkProgress], progress: BulkProgress, budget: float | None
) -> BulkProgress:
    """Batches taken until they end or `budget` seconds have passed; the progress then."""
    deadline = None if budget is None else time.monotonic() + budget
    async with aclosing(batches) as taken:
        async for reached in taken:
            progress = reached
            if deadline is not None and time.monotonic() >= deadline:
                break
    return progress
