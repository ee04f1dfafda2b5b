"""What a step attempt leaves behind, and what that means for the engine's columns.

`Outcome` is what a step's directive (or its failure) means for its row;
`Write` carries it to the commit queue with its claim and attempt record.
Both commit paths, the typed one (`commits`) and the array-driven one
(`fast`), take a write's values from `write_fields` and turn them
into columns with `outcome_values`, so they cannot disagree on what an
outcome means (`tests/test_commits.py` checks that they write the same).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Boolean, DateTime, Integer, Interval, Table, Text, case, func

from engine.claims.claim import Claim
from engine.model.attempt_log import FAILURE_FIELDS, RECORD_FIELDS
from engine.model.companions import Companion


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt, as the attempt log stores it."""

    run_key: str
    step: str
    attempt: int
    outcome: str
    error: str | None
    took_ms: float
    traceback: str | None = None  # a failed attempt's, scrubbed and bounded
    args: Any = None  # a failed attempt's arguments, as JSON holds them

    @property
    def failure(self) -> bool:
        """Whether this record carries a failure's traceback or arguments."""
        return self.traceback is not None or self.args is not None


@dataclass(frozen=True)
class Outcome:
    """The engine columns a step attempt leaves on its row, and the row's own changes.

    `wake_after` schedules `next_step` that long from now, `wake_at` at an
    instant of the database clock (a schedule's next occurrence, which must
    not drift by however long the commit took); with neither, nothing is
    scheduled. `hold` instead keeps the lease that long, for a worker that
    runs the next step itself.
    """

    next_step: str | None
    next_args: dict[str, Any] | None
    attempts: int = 0
    last_error: str | None = None
    wake_after: timedelta | None = None
    wake_at: datetime | None = None
    hold: timedelta | None = None
    changes: dict[str, Any] = field(default_factory=dict)  # column name -> value
    # Waiting for an event: the step it waits on (next_step is then the timeout step).
    waiting_for: str | None = None
    # What becomes of a held event: "keep" it for a later wait, "discard" it (the run
    # stops, waits for something else, or goes round its schedule), or "wait": apply it
    # now if it is for `waiting_for`, else discard it.
    pending: str = "keep"
    recent_event_keys: list[str] | None = None  # set when this attempt took an event key


@dataclass(frozen=True)
class Write:
    """One step outcome to commit against a claim, with what goes in the same commit."""

    claim: Claim
    outcome: Outcome
    record: AttemptRecord | None = None  # the attempt to log, when a log is mapped
    announce: bool = False  # NOTIFY: this write leaves work ready for any worker
    fan_out: Any = None  # a FanOut whose children start in this same commit
    finishes_child_of: dict[str, Any] | None = None  # the parent this run was the child of
    companions: tuple[Companion, ...] = ()  # rows written only if this write lands

    @property
    def needs_transaction(self) -> bool:
        """Whether this write touches other rows too (children, a parent) in its commit."""
        return self.fan_out is not None or self.finishes_child_of is not None


# The values of a write, by name, as both commit paths pass them: the outcome's, then the
# attempt record's (prefixed log_), in this order.
OUTCOME_FIELDS = (
    "version",
    "next_step",
    "next_args",
    "attempts",
    "last_error",
    "wake_after",
    "wake_at",
    "hold",
    "waiting_for",
    "clears_event",
)
LOG_FIELDS = tuple(f"log_{name}" for name, _ in RECORD_FIELDS)
FAILURE_LOG_FIELDS = tuple(f"log_{name}" for name, _ in FAILURE_FIELDS)
# Their SQL types, as parameters and array elements; each path overrides what it must.
FIELD_TYPES: dict[str, Any] = {
    "version": Integer,
    "next_step": Text,
    "next_args": Text,  # JSON text
    "attempts": Integer,
    "last_error": Text,
    "wake_after": Interval,
    "wake_at": DateTime(timezone=True),
    "hold": Interval,
    "waiting_for": Text,
    "clears_event": Boolean,
    **{f"log_{name}": type_ for name, type_ in (*RECORD_FIELDS, *FAILURE_FIELDS)},
}


def write_fields(write: Write) -> dict[str, Any]:
    """A write flattened to one value per field of OUTCOME_FIELDS (and LOG_FIELDS and
    FAILURE_LOG_FIELDS if logged)."""
    outcome = write.outcome
    fields: dict[str, Any] = {
        "version": write.claim.version,
        "next_step": outcome.next_step,
        "next_args": outcome.next_args,
        "attempts": outcome.attempts,
        "last_error": outcome.last_error,
        "wake_after": outcome.wake_after,
        "wake_at": outcome.wake_at,
        "hold": outcome.hold,
        "waiting_for": outcome.waiting_for,
        "clears_event": outcome.pending != "keep",
    }
    record = write.record
    if record is not None:
        fields.update(
            log_run_key=record.run_key,
            log_step=record.step,
            log_attempt=record.attempt,
            log_outcome=record.outcome,
            log_error=record.error,
            log_took_ms=record.took_ms,
            log_traceback=record.traceback,
            # JSON text on both paths: only a failed attempt has any to encode.
            log_args=None if record.args is None else json.dumps(record.args, default=str),
        )
    return fields


def outcome_values(table: Table, value: Callable[[str], Any], now: Any) -> dict[Any, Any]:
    """The SET clause of a fenced write: each engine column from `value(field)`'s SQL."""
    hold = value("hold")
    return {
        table.c.next_step: value("next_step"),
        table.c.next_args: value("next_args"),
        table.c.attempts: value("attempts"),
        table.c.last_error: value("last_error"),
        # A held row stays leased (and is due again when the lease ends); otherwise it is
        # due at wake_at or after wake_after, and never when both are NULL.
        table.c.claimed_until: now + hold,
        table.c.wake_at: func.coalesce(now + hold, value("wake_at"), now + value("wake_after")),
        table.c.waiting_for: value("waiting_for"),
        # A held event survives a step that goes on, not one that ends the run or waits.
        table.c.pending_event: case((value("clears_event"), None), else_=table.c.pending_event),
        # The fence moves on with the write.
        table.c.wf_version: value("version") + 1,
    }


def log_values(value: Callable[[str], Any], failures: bool) -> list[Any]:
    """The attempt record's SQL values, in the order `attempt_log.log_attempts` takes them
    (a failure's too, for a statement that may log one)."""
    return [value(name) for name in (*LOG_FIELDS, *(FAILURE_LOG_FIELDS if failures else ()))]


def logs_failure(writes: Sequence[Write]) -> bool:
    """Whether any of `writes` logs a failure's traceback or arguments."""
    return any(write.record is not None and write.record.failure for write in writes)
