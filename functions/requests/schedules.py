"""The schedules from outside: list them, and pause, resume or trigger one as someone.

The API, the console and `duly schedules` call these; each action is recorded
in the audit trail (`schedule.pause`, ...) in the action's own transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from engine import (
    SCHEDULE_ACTIONS,
    NotFoundError,
    ScheduleAction,
    ScheduledRun,
    Steered,
    WorkflowConnection,
    list_schedules,
    record_action,
    steer_schedule,
)
from functions.requests.lookup import find_writable
from functions.requests.runs import url_key

ACTION_SENTENCES = {  # (what changed, what stood already)
    "pause": ("paused: nothing fires until it is resumed", "paused already"),
    "resume": ("resumed", "not paused: nothing changed"),
    "trigger": ("triggered: it fires now", "due now already"),
}


async def scheduled_runs(
    connection: WorkflowConnection, workflow: str | None = None
) -> list[ScheduledRun]:
    """The scheduled runs of `workflow`, or of every workflow served."""
    infos = None if workflow is None else [find_writable(connection, workflow)]
    return await list_schedules(connection, infos)


def schedule_action(action: str) -> ScheduleAction:
    """`action` as one of SCHEDULE_ACTIONS; NotFoundError for any other word."""
    for known in SCHEDULE_ACTIONS:
        if action == known:
            return known
    raise NotFoundError(f"No schedule action {action!r}: use one of {', '.join(SCHEDULE_ACTIONS)}.")


async def steer(
    connection: WorkflowConnection,
    workflow: str,
    key: str,
    action: str,
    *,
    actor: str,
    via: str,
) -> dict[str, Any]:
    """Pause, resume or trigger the scheduled run `key` (as a URL spells it), recorded as
    `actor` through `via`; what the run now stands as."""
    info = find_writable(connection, workflow)
    chosen = schedule_action(action)
    run = url_key(info, key)

    async def record(session: AsyncSession, steered: Steered) -> None:
        await record_action(
            session,
            actor=actor,
            via=via,
            action=f"schedule.{chosen}",
            workflow=info.name,
            subject={"key": run.text},
            count=1 if steered.changed else 0,
            detail={"next_firing": steered.next_firing, "paused": steered.paused},
        )

    steered = await steer_schedule(connection, info, run.values, chosen, record=record)
    done = ACTION_SENTENCES[chosen][0 if steered.changed else 1]
    shown = run.text
    return {
        "workflow": info.name,
        "key": shown,
        "action": chosen,
        "changed": steered.changed,
        "paused": steered.paused,
        "next_firing": steered.next_firing.isoformat() if steered.next_firing else None,
        "message": f"The {info.name} run {shown} is {done}.",
    }
