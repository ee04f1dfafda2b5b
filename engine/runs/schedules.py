"""Schedules you can steer: what `every(...)` leaves on its run, and pause, resume, trigger.

The worker writes a scheduled run's schedule into `next_args`, beside the
step's arguments, under `SCHEDULE_ENTRY`. Pausing keeps the step and clears
`wake_at`, so no claim takes the run until it is resumed or triggered. Each
action is one short transaction that leaves a step running now alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from engine.base.clock import db_now
from engine.base.cron import Cron
from engine.base.errors import NotFoundError, RunBusyError
from engine.base.notify import notify
from engine.model.connection import WorkflowConnection
from engine.model.registry import WorkflowInfo

SCHEDULE_ENTRY = "schedule"  # the key of next_args that holds a scheduled run's schedule
LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a NOWAIT lock another transaction holds
ScheduleAction = Literal["pause", "resume", "trigger"]
SCHEDULE_ACTIONS: tuple[ScheduleAction, ...] = ("pause", "resume", "trigger")
Recorder = Callable[[AsyncSession, "Steered"], Awaitable[None]]


def schedule_entry(
    schedule: timedelta | Callable[[datetime], datetime],
    fired_at: datetime | None,
    paused_until_due: datetime | None = None,
) -> dict[str, Any]:
    """What a run's schedule stores: its kind and expression, its last firing, its pause.

    `paused_until_due` is the occurrence a paused run would have fired at: it
    stays paused, and an interval's grid goes on from there when resumed.
    """
    entry: dict[str, Any]
    if isinstance(schedule, timedelta):
        entry = {"interval": schedule.total_seconds()}
    elif isinstance(schedule, Cron):
        entry = {"cron": schedule.expression, "zone": schedule.zone}
    else:
        named = getattr(schedule, "__qualname__", None) or type(schedule).__qualname__
        entry = {"function": f"{getattr(schedule, '__module__', '?')}.{named}"}
    if fired_at is not None:
        entry["fired_at"] = fired_at.isoformat()
    if paused_until_due is not None:
        entry["paused"] = True
        entry["due"] = paused_until_due.isoformat()
    return entry


def paused_entry(next_args: Mapping[str, Any] | None) -> bool:
    """Whether these stored arguments belong to a paused schedule."""
    entry = (next_args or {}).get(SCHEDULE_ENTRY)
    return isinstance(entry, dict) and bool(entry.get("paused"))


def next_occurrence(entry: Mapping[str, Any], now: datetime) -> datetime:
    """When a resumed schedule fires next: its next occurrence after `now`.

    A cron's next time; an interval's next point on its grid (from the
    occurrence the pause held back); a function's schedule is asked again by
    the firing itself, so it fires now.
    """
    if "cron" in entry:
        return Cron(entry["cron"], entry.get("zone", "UTC"))(now)
    if "interval" in entry and entry.get("due"):
        interval = timedelta(seconds=entry["interval"])
        due = datetime.fromisoformat(entry["due"])
        if due > now:
            return due
        return due + interval * ((now - due) // interval + 1)
    return now


@dataclass(frozen=True)
class Steered:
    """What an action left on a scheduled run: whether it is paused, when it fires next."""

    workflow: str
    key: tuple[Any, ...]
    action: ScheduleAction
    paused: bool
    next_firing: datetime | None
    changed: bool  # False when the run already stood so (pausing a paused run)


async def steer_schedule(
    connection: WorkflowConnection,
    info: WorkflowInfo,
    key: tuple[Any, ...],
    action: ScheduleAction,
    *,
    record: Recorder | None = None,
) -> Steered:
    """Pause, resume or trigger the scheduled run `key` of `info`; owns its transaction.

    A run whose step is running now is refused (RunBusyError) without waiting
    for its lock; `record` is called in the same transaction, so the action and
    its record of who did it commit together.
    """
    table = info.table
    shown = key[0] if len(key) == 1 else list(key)
    where = [column == value for column, value in zip(info.mapper.primary_key, key, strict=True)]
    busy = RunBusyError(
        f"The {info.name} run {shown} is running its step now: try again once it has committed."
    )
    async with connection.sessionmaker() as session, session.begin():
        query = (
            select(table.c.next_step, table.c.next_args, table.c.wake_at, table.c.claimed_until)
            .add_columns(db_now().label("now"))
            .where(*where)
            .with_for_update(nowait=True)  # a claim or a commit holds it: refuse, never wait
        )
        try:
            row = (await session.execute(query)).one_or_none()
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise busy from None
            raise
        if row is None:
            raise NotFoundError(f"No {info.name} run has the key {shown}.")
        entry = (row.next_args or {}).get(SCHEDULE_ENTRY)
        if row.next_step is None or not isinstance(entry, dict):
            raise NotFoundError(
                f"The {info.name} run {shown} is not on a schedule: only a run whose step "
                "returned every(...) has one."
            )
        now: datetime = row.now
        if row.claimed_until is not None and row.claimed_until > now:
            raise busy
        entry, wake_at = _steered(action, dict(entry), row.wake_at, now)
        changed = (entry, wake_at) != (row.next_args[SCHEDULE_ENTRY], row.wake_at)
        if changed or row.claimed_until is not None:
            await session.execute(
                update(table)
                .where(*where)
                .values(
                    next_args={**row.next_args, SCHEDULE_ENTRY: entry},
                    wake_at=wake_at,
                    claimed_until=None,  # a lease that ran out: its worker's commit is fenced
                    wf_version=table.c.wf_version + 1,
                )
            )
        if wake_at is not None and changed:
            await session.execute(notify(table.name))  # workers look at the table again
        steered = Steered(info.name, key, action, bool(entry.get("paused")), wake_at, changed)
        if record is not None:
            await record(session, steered)
    if wake_at is not None and changed:
        connection.kick(info.name)
    return steered


def _steered(
    action: ScheduleAction, entry: dict[str, Any], wake_at: datetime | None, now: datetime
) -> tuple[dict[str, Any], datetime | None]:
    """The schedule entry and wake_at an action leaves."""
    paused = bool(entry.get("paused"))
    if action == "pause":
        if not paused:
            # The occurrence held back; when the run was not due yet, its wake_at.
            entry |= {"paused": True, "due": (wake_at or now).isoformat()}
        return entry, None
    if action == "resume":
        if not paused:
            return entry, wake_at
        following = next_occurrence(entry, now)
        for held in ("paused", "due", "behind"):
            entry.pop(held, None)
        return entry | {"occurrence": following.isoformat()}, following
    # Trigger: due now. A paused run fires once and stays paused (the worker keeps it so).
    # The firing serves the trigger's instant, so an interval counts on from it.
    entry.pop("behind", None)
    return entry | {"occurrence": now.isoformat()}, now
