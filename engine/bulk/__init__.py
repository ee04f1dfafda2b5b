"""Bulk actions: what a filter matches, counted by a dry run, then acted on in short batches.

    plan = await plan_runs(connection, info, RunFilter(state="failed"))
    progress = await start_runs(connection, info, filters, action,
                                expected=plan.matched, upto=plan.upto)
    async for progress in apply_runs(connection, info, filters, action, progress, actor): ...

Runs (run a step, cancel) and the outbox's dead letters (replay) alike; each applied batch
records who acted in the audit trail, in the batch's own transaction, as one run's start,
step or cancel and a replay do (`single.py`).
"""

from __future__ import annotations

from engine.base.errors import BulkChangedError
from engine.bulk.dead_letters import (
    DeadLetterFilter,
    DeadLetterPlan,
    apply_replay,
    plan_replay,
    resume_replay,
    start_replay,
)
from engine.bulk.progress import BATCH_SIZE, AuditActor, BulkProgress
from engine.bulk.runs import (
    BulkCancel,
    BulkRun,
    RunAction,
    RunPlan,
    apply_runs,
    filter_subject,
    plan_runs,
    resume_runs,
    start_runs,
)
from engine.bulk.single import cancel_recorded, replay_recorded, run_recorded, start_recorded

__all__ = [
    "BATCH_SIZE",
    "AuditActor",
    "BulkCancel",
    "BulkChangedError",
    "BulkProgress",
    "BulkRun",
    "DeadLetterFilter",
    "DeadLetterPlan",
    "RunAction",
    "RunPlan",
    "apply_replay",
    "apply_runs",
    "cancel_recorded",
    "filter_subject",
    "plan_replay",
    "plan_runs",
    "replay_recorded",
    "resume_replay",
    "resume_runs",
    "run_recorded",
    "start_recorded",
    "start_replay",
    "start_runs",
]
