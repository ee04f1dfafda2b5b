"""One run's writes (a start, a step, a cancel) and a replay, each audited in its transaction.

The engine's own statements (a start's insert, a handle's run and cancel), run in a
session whose transaction also records who acted: the record exists exactly when the
write committed. Workers in this process are kicked after the commit, as the handles do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy.orm import make_transient_to_detached

from engine.base.audit import record_action
from engine.bulk.progress import AuditActor
from engine.events.database import replay_statement
from engine.events.records import EventTables
from engine.model.connection import current_connection
from engine.model.registry import WorkflowInfo
from engine.model.rows import refresh_row
from engine.model.steps import Call
from engine.runs.fanout import children_finished
from engine.runs.handles import cancel_statement, run_statement
from engine.runs.start import start_statement


async def start_recorded(info: WorkflowInfo, row: Any, call: Call[Any], actor: AuditActor) -> bool:
    """Insert `row` with `call` due now and record `run.start`; False on a unique conflict
    (nothing written, nothing recorded)."""
    statement, params = start_statement(info, row, call)
    connection = current_connection()
    async with connection.sessionmaker.begin() as session:
        inserted = (await session.execute(statement, params)).first()
        if inserted is None:
            return False
        refresh_row(info, row, inserted._mapping)
        key = list(info.mapper.primary_key_from_instance(row))
        subject = {"key": key if len(key) > 1 else key[0]}
        await _record(session, actor, "run.start", info, subject, 1, call.step.name)
    make_transient_to_detached(row)
    connection.kick(info.name)
    return True


async def run_recorded(
    info: WorkflowInfo,
    where: Sequence[ColumnElement[bool]],
    call: Call[Any],
    actor: AuditActor,
    subject: Any,
) -> int:
    """Run `call` now on the runs `where` matches and record `run.step`; how many."""
    connection = current_connection()
    async with connection.sessionmaker.begin() as session:
        addressed = int((await session.execute(run_statement(info, where, call))).one()[0])
        await _record(session, actor, "run.step", info, subject, addressed, call.step.name)
    connection.kick(info.name)
    return addressed


async def cancel_recorded(
    info: WorkflowInfo, where: Sequence[ColumnElement[bool]], actor: AuditActor, subject: Any
) -> int:
    """End the live runs `where` matches and record `run.cancel`; how many were live."""
    async with current_connection().sessionmaker.begin() as session:
        ended = (await session.execute(cancel_statement(info, where))).all()
        # A cancelled child counts as finished to the run that fanned it out.
        conn = await session.connection()
        await children_finished(conn, [row.parent for row in ended if row.parent], info)
        await _record(session, actor, "run.cancel", info, subject, len(ended), None)
    return len(ended)


async def replay_recorded(
    tables: EventTables, event_ids: list[str] | None, actor: AuditActor
) -> list[str]:
    """Make dead letters due again (those of `event_ids`, or every one) and record
    `outbox.replay`; their ids. A replay that found nothing to replay records nothing (the
    API answers it 409 for one event)."""
    connection = current_connection()
    outbox = tables.outbox_table
    async with connection.sessionmaker.begin() as session:
        statement = replay_statement(tables, event_ids is not None)
        rows = (await session.execute(statement, {"ids": event_ids})).all()
        replayed = [row.event_id for row in rows]
        if not replayed:
            return []
        subject = {"event_ids": event_ids} if event_ids is not None else {"every": True}
        await record_action(
            session,
            actor=actor.id,
            via=actor.via,
            action="outbox.replay",
            workflow=outbox.name,
            subject=subject,
            count=len(replayed),
        )
    connection.kick(outbox.name)
    return replayed


async def _record(
    session: Any,
    actor: AuditActor,
    action: str,
    info: WorkflowInfo,
    subject: Any,
    count: int,
    step: str | None,
) -> None:
    await record_action(
        session,
        actor=actor.id,
        via=actor.via,
        action=action,
        workflow=info.name,
        subject=subject,
        count=count,
        detail=None if step is None else {"step": step},
    )
