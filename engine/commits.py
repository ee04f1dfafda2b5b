"""Fenced writes: every change to a claimed row commits only if the row has not moved.

Each write is one statement on an autocommit connection:

    WITH moved AS (UPDATE t SET ... WHERE key AND wf_version = :claimed RETURNING t.*)
         [, logged AS (INSERT INTO attempt_log SELECT ... FROM moved)]
    SELECT moved.* [, pg_notify('duly', 't')] FROM moved

so the row's new state, its attempt record and the news that work is ready
commit together or not at all, and an empty result is the typed outcome
"fenced": another worker took the row over, or `run()` preempted it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, func, literal, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from engine.clock import db_now
from engine.notify import CHANNEL
from engine.rows import key_clause
from engine.steps import Call
from engine.workflow import WorkflowInfo


@dataclass
class Claim:
    """A row this worker holds: which table, which key, and the version it may commit against."""

    info: WorkflowInfo
    key: tuple[Any, ...]
    version: int


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt, as the attempt log stores it."""

    run_key: str
    step: str
    attempt: int
    outcome: str
    error: str | None
    took_ms: float


def schedule(
    call: Call[Any], *, delay: timedelta | None, lease: timedelta | None
) -> dict[str, Any]:
    """Engine columns for "run `call` next": after `delay`, or now under a kept `lease`."""
    lease_end = db_now() + literal(lease) if lease is not None else None
    return {
        "next_step": call.step.name,
        "next_args": call.encoded,
        "attempts": 0,
        "last_error": None,
        "claimed_until": lease_end,
        "wake_at": lease_end if lease_end is not None else db_now() + literal(delay),
    }


def stop(*, failures: int = 0, error: str | None = None) -> dict[str, Any]:
    """Engine columns for a run with nothing left to do (finished, or given up)."""
    return {
        "next_step": None,
        "next_args": None,
        "wake_at": None,
        "claimed_until": None,
        "attempts": failures,
        "last_error": error,
    }


def retry(*, failures: int, error: str, delay: timedelta) -> dict[str, Any]:
    """Engine columns for trying the same step again after `delay`."""
    return {
        "attempts": failures,
        "last_error": error,
        "claimed_until": None,
        "wake_at": db_now() + literal(delay),
    }


def hand_back() -> dict[str, Any]:
    """Engine columns that release a lease so any worker may take the row at once."""
    return {"claimed_until": None, "wake_at": db_now()}


def renew(lease: timedelta) -> dict[str, Any]:
    """Engine columns that extend a lease, keeping the row's version."""
    lease_end = db_now() + literal(lease)
    return {"claimed_until": lease_end, "wake_at": lease_end}


async def fenced_write(
    conn: AsyncConnection,
    claim: Claim,
    values: dict[Any, Any],
    *,
    attempt_log: type[Any] | None = None,
    record: AttemptRecord | None = None,
    announce: bool = False,
    bump: bool = True,
) -> Row[Any] | None:
    """Write `values` to the claimed row if its version is still the claimed one.

    Returns the row as written, or None when fenced. `bump` moves the version
    on (every write but a lease renewal), so a stale holder is fenced in turn.
    """
    table = claim.info.table
    new_version = claim.version + 1 if bump else claim.version
    moved = (
        update(table)
        .where(key_clause(claim.info, claim.key), table.c.wf_version == claim.version)
        .values(values)
        .values(wf_version=new_version)
        .returning(*table.c)
        .cte("moved")
    )
    query = select(moved)
    if attempt_log is not None and record is not None:
        logged = (
            insert(attempt_log.__table__)
            .from_select(
                [
                    "workflow",
                    "run_key",
                    "step",
                    "attempt",
                    "outcome",
                    "error",
                    "took_ms",
                    "finished_at",
                ],
                select(
                    literal(table.name),
                    literal(record.run_key),
                    literal(record.step),
                    literal(record.attempt),
                    literal(record.outcome),
                    literal(record.error),
                    literal(record.took_ms),
                    db_now(),
                ).select_from(moved),
            )
            .cte("logged")
        )
        query = query.add_cte(logged)
    if announce:
        query = query.add_columns(func.pg_notify(CHANNEL, table.name))
    return (await conn.execute(query)).first()
