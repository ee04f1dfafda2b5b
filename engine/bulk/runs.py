"""Acting on every run a filter matches: the dry run, its confirmation, then short batches.

A batch is one transaction: the next BATCH_SIZE matching keys, those with no live lease
locked `FOR UPDATE SKIP LOCKED` (the rest skipped and counted, never waited on), the
action written with the handles' own statement, and its audit record. Nothing past the
dry run's highest key is touched; an apply that would touch more runs than the dry run
counted is refused (see `engine/bulk/__init__.py` for the calls in order).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from engine.base.clock import db_now
from engine.bulk.progress import (
    BATCH_SIZE,
    AuditActor,
    BulkProgress,
    confirm_count,
    digest_of,
    hold_position,
    record_batch,
)
from engine.model.connection import WorkflowConnection
from engine.model.registry import WorkflowInfo
from engine.model.steps import Call
from engine.runs.fanout import children_finished
from engine.runs.handles import cancel_statement, run_statement
from engine.views.filters import key_of
from engine.views.runs import RunFilter, key_text_of


@dataclass(frozen=True)
class BulkRun:
    """Run a step now on each run (what `retry` is, on the failed runs), replacing its schedule."""

    call: Call[Any]
    retry: bool = False  # asked for as `retry`: the audit names it so

    @property
    def name(self) -> str:
        """The audit's action, named as the command that asked for it."""
        return "bulk.retry" if self.retry else "bulk.run"

    def described(self) -> dict[str, Any]:
        """The action as the audit's detail and the digest read it."""
        return {"step": self.call.step.name, "args": self.call.encoded}


@dataclass(frozen=True)
class BulkCancel:
    """End each run where it stands."""

    @property
    def name(self) -> str:
        """The audit's action."""
        return "bulk.cancel"

    def described(self) -> dict[str, Any]:
        """The action as the audit's detail and the digest read it."""
        return {}


RunAction = BulkRun | BulkCancel


@dataclass(frozen=True)
class RunPlan:
    """What a dry run found: the rows the filter matches, those a worker holds now, the bound."""

    workflow: str
    matched: int
    held: int  # leased now: an apply skips them unless their lease ends first
    upto: tuple[Any, ...] | None  # the highest key matched; None when none is

    def to_dict(self) -> dict[str, Any]:
        """As the API answers it: `expected` and `upto` are what an apply confirms."""
        return {
            "workflow": self.workflow,
            "dry_run": True,
            "expected": self.matched,
            "held": self.held,
            "upto": None if self.upto is None else key_text_of(self.upto),
        }


def filter_subject(filters: RunFilter) -> dict[str, Any]:
    """A filter as the audit's subject: the fields it sets, each column's comparison as text."""
    subject: dict[str, Any] = {
        name: value
        for name in ("state", "step", "key", "error")
        if (value := getattr(filters, name)) is not None
    }
    if filters.columns:
        subject["columns"] = [f"{c.column} {c.operator} {c.value}" for c in filters.columns]
    return subject


def _keys(info: WorkflowInfo) -> Any:
    columns = list(info.mapper.primary_key)
    return columns[0] if len(columns) == 1 else tuple_(*columns)


def _key_value(key: tuple[Any, ...]) -> Any:
    return key[0] if len(key) == 1 else tuple_(*key)


def _bounded(
    info: WorkflowInfo, filters: RunFilter, after: tuple[Any, ...] | None, upto: tuple[Any, ...]
) -> list[ColumnElement[bool]]:
    """The filter's clauses, after the last key read and up to the snapshot bound."""
    keys = _keys(info)
    where = [*filters.clauses(info), keys <= _key_value(upto)]
    if after is not None:
        where.append(keys > _key_value(after))
    return where


def typed_key(info: WorkflowInfo, values: Sequence[Any] | None) -> tuple[Any, ...] | None:
    """A key from a continuation or a form (JSON values, or its URL text) as typed values."""
    if values is None:
        return None
    return key_of(info, values).values


async def plan_runs(
    connection: WorkflowConnection, info: WorkflowInfo, filters: RunFilter
) -> RunPlan:
    """The dry run: how many runs match, how many a worker holds now, the highest key.

    It writes nothing.
    """
    table = info.table
    where = filters.clauses(info)
    held = table.c.claimed_until > db_now()
    counted = select(func.count(), func.count().filter(held)).where(*where)
    highest = (
        select(*info.mapper.primary_key)
        .where(*where)
        .order_by(*(c.desc() for c in info.mapper.primary_key))
        .limit(1)
    )
    async with connection.sessionmaker() as session:
        matched, leased = (await session.execute(counted.select_from(table))).one()
        top = (await session.execute(highest)).first()
    return RunPlan(info.name, int(matched), int(leased), None if top is None else tuple(top))


async def start_runs(
    connection: WorkflowConnection,
    info: WorkflowInfo,
    filters: RunFilter,
    action: RunAction,
    *,
    expected: int,
    upto: Sequence[Any] | None,
) -> BulkProgress:
    """An apply's start, confirmed by the dry run's `expected` count and `upto` key.

    A BulkChangedError when the filter now matches more runs up to that key than the
    dry run counted: the set has grown since, and nobody confirmed the new rows.
    """
    bound = typed_key(info, upto)
    digest = digest_of(info.name, action.name, action.described(), filter_subject(filters))
    progress = BulkProgress.started(action.name, expected, bound, digest)
    if bound is not None:
        await confirm_count(
            connection,
            info.table,
            _bounded(info, filters, None, bound),
            expected=expected,
            rows=f"{info.name} runs up to key {key_text_of(bound)}",
        )
    return progress


def resume_runs(
    info: WorkflowInfo, filters: RunFilter, action: RunAction, continuation: str
) -> BulkProgress:
    """Where an apply stopped, from the `next` it answered; a DulyError for another filter."""
    digest = digest_of(info.name, action.name, action.described(), filter_subject(filters))
    progress = BulkProgress.decode(continuation, digest)
    after, upto = typed_key(info, progress.after), typed_key(info, progress.upto)
    return replace(progress, after=after, upto=upto)


async def apply_runs(
    connection: WorkflowConnection,
    info: WorkflowInfo,
    filters: RunFilter,
    action: RunAction,
    progress: BulkProgress,
    actor: AuditActor,
) -> AsyncGenerator[BulkProgress]:
    """Act on the matching runs batch by batch from `progress`; yield after each commit.

    Each batch owns its transaction, audit record included. Stop iterating at any
    yield and go on later from the progress yielded (its `encode()`).
    """
    while not progress.finished:
        before = progress.done
        async with connection.sessionmaker() as session, session.begin():
            progress = await _batch(session, info, filters, action, progress, actor)
        if isinstance(action, BulkRun) and progress.done > before:
            connection.kick(info.name)  # workers in this process: NOTIFY tells the rest
        yield progress


async def _batch(
    session: AsyncSession,
    info: WorkflowInfo,
    filters: RunFilter,
    action: RunAction,
    progress: BulkProgress,
    actor: AuditActor,
) -> BulkProgress:
    """One batch, in the caller's transaction: read, lock what is free, act, record."""
    await hold_position(session, progress, actor, action=action.name, workflow=info.name)
    if progress.upto is None:  # only a start with nothing matched: finished already
        return replace(progress, finished=True)
    table = info.table
    keys = list(info.mapper.primary_key)
    where = _bounded(info, filters, progress.after, progress.upto)
    # The next rows of the walk by key, unlocked: the batch's extent, and the skipped count's
    # base; one more is read to know whether the walk ends here.
    window = select(*keys).where(*where).order_by(*keys).limit(BATCH_SIZE + 1)
    read = [tuple(row) for row in (await session.execute(window)).all()]
    seen = read[:BATCH_SIZE]
    if not seen and progress.record is None:
        return replace(progress, finished=True)
    in_window = _keys(info).in_([_key_value(key) for key in seen])
    # Of those, the rows no worker holds: a live lease is skipped (its step may commit),
    # and a row another transaction has locked is passed over, never waited on.
    free = (
        select(*keys)
        .where(in_window, *filters.clauses(info))
        .where(or_(table.c.claimed_until.is_(None), table.c.claimed_until <= db_now()))
        .with_for_update(skip_locked=True)
    )
    taken = [tuple(row) for row in (await session.execute(free)).all()]
    done = 0
    if taken:
        chosen = [_keys(info).in_([_key_value(key) for key in taken])]
        if isinstance(action, BulkRun):
            done = int((await session.execute(run_statement(info, chosen, action.call))).one()[0])
        else:
            ended = (await session.execute(cancel_statement(info, chosen))).all()
            conn = await session.connection()
            await children_finished(conn, [row.parent for row in ended if row.parent], info)
            done = len(ended)
    return await record_batch(
        session,
        progress,
        actor,
        read=len(seen),
        done=done,
        # A continuation's window that came back empty is recorded too: its `next` is spent.
        after=seen[-1] if seen else progress.after,
        last=len(read) <= BATCH_SIZE,
        action=action.name,
        workflow=info.name,
        subject=filter_subject(filters),
        detail=action.described(),
    )
