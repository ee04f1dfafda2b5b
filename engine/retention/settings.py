"""How long duly keeps what it owns, read from `DULY_*` environment variables.

    DULY_RETAIN_ATTEMPTS_DAYS    30: attempt-log rows, by when the attempt finished
    DULY_RETAIN_EVENTS_DAYS      30: processed outbox rows, with their event records and
                                 delivery attempts, by when the row was settled
    DULY_RETAIN_EXECUTIONS_DAYS  30: finished durable executions, by when they finished
    DULY_PRUNE_BATCH_SIZE        5000: rows one batch deletes, in a transaction of its own
    DULY_PRUNE_PAUSE_MS          100: milliseconds of pause after a batch that deleted rows,
                                 so the disk and a CPU stay the workers' (0: none)
    DULY_PRUNE_ON_DRAIN          off: the drain function prunes after routing
    DULY_PRUNE_DRAIN_BATCHES     2: batches that pass makes at most, per table

A period is a whole number of days from 1 to 36500, or `never` (that kind
is kept for good). Unlike the outbox's numbers, a bad value is never
replaced by a default: deleting on a period nobody chose is worse than not
starting, so every bad variable is named in one `ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigurationError
from engine.events.settings import read_flag

ATTEMPTS = "attempts"
EVENTS = "events"
EXECUTIONS = "executions"
KINDS = (ATTEMPTS, EVENTS, EXECUTIONS)
DAYS_VARIABLES = {
    ATTEMPTS: "DULY_RETAIN_ATTEMPTS_DAYS",
    EVENTS: "DULY_RETAIN_EVENTS_DAYS",
    EXECUTIONS: "DULY_RETAIN_EXECUTIONS_DAYS",
}
NEVER = "never"
DEFAULT_DAYS = 30
MAX_DAYS = 36_500  # a century: a cutoff further back leaves the calendar
DEFAULT_BATCH_SIZE = 5_000  # rows a batch deletes
MAX_BATCH_SIZE = 100_000  # past it a batch is no longer a short transaction
# Milliseconds after a batch that deleted. Flat out (0), a prune of 1,000,000 attempt-log
# rows took 1.1 to 1.6 s here but its WAL delayed a worker's commits (claim p99 up to 4-5x);
# paused 100 ms, it takes about 20 s and the claim p99 stays within 1.3-1.4x (bench/prune.py).
DEFAULT_PAUSE_MS = 100
MAX_PAUSE_MS = 60_000
DEFAULT_DRAIN_BATCHES = 2  # batches a drain-time pass makes at most, per walk


@dataclass(frozen=True)
class RetentionSettings:
    """The retention period of each kind (None: kept for good) and how pruning goes."""

    attempts_days: int | None = DEFAULT_DAYS
    events_days: int | None = DEFAULT_DAYS
    executions_days: int | None = DEFAULT_DAYS
    batch_size: int = DEFAULT_BATCH_SIZE
    pause_ms: int = DEFAULT_PAUSE_MS
    prune_on_drain: bool = False
    drain_batches: int = DEFAULT_DRAIN_BATCHES

    def __post_init__(self) -> None:
        problems = [
            problem
            for kind in KINDS
            if (problem := days_problem(self.days_for(kind), f"{kind}_days")) is not None
        ]
        for name, least, most in (
            ("batch_size", 1, MAX_BATCH_SIZE),
            ("pause_ms", 0, MAX_PAUSE_MS),
            ("drain_batches", 1, None),
        ):
            problem = whole_problem(getattr(self, name), name, most, least)
            if problem is not None:
                problems.append(problem)
        if problems:
            raise ConfigurationError("Retention settings refused: " + "; ".join(problems) + ".")

    def days_for(self, kind: str) -> int | None:
        """The retention period of `kind` (one of KINDS) in days; None when kept for good."""
        days: int | None = getattr(self, f"{kind}_days")
        return days

    def with_days(self, days: int) -> RetentionSettings:
        """The same settings with one period for every kind (`duly prune --older-than-days`)."""
        return dataclasses.replace(self, attempts_days=days, events_days=days, executions_days=days)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RetentionSettings:
        """Read the variables (os.environ unless given); one ConfigurationError names every
        bad one."""
        env = os.environ if environ is None else environ
        problems: list[str] = []
        values: dict[str, Any] = {}
        numbers: list[tuple[str, str, int, int | None]] = [
            (f"{kind}_days", variable, 1, MAX_DAYS) for kind, variable in DAYS_VARIABLES.items()
        ]
        numbers += [
            ("batch_size", "DULY_PRUNE_BATCH_SIZE", 1, MAX_BATCH_SIZE),
            ("pause_ms", "DULY_PRUNE_PAUSE_MS", 0, MAX_PAUSE_MS),
            ("drain_batches", "DULY_PRUNE_DRAIN_BATCHES", 1, None),
        ]
        for name, variable, least, most in numbers:
            raw = env.get(variable, "").strip()
            if not raw:
                continue
            if name.endswith("_days") and raw.lower() == NEVER:
                values[name] = None
                continue
            try:
                values[name] = int(raw)
            except ValueError:
                also = f" or {NEVER!r}" if name.endswith("_days") else ""
                problems.append(f"{variable} must be a whole number{also}, not {raw!r}")
                continue
            problem = whole_problem(values[name], variable, most, least)
            if problem is not None:
                problems.append(problem)
        try:
            values["prune_on_drain"] = read_flag(env, "DULY_PRUNE_ON_DRAIN", default=False)
        except ConfigurationError as exc:
            problems.append(str(exc).rstrip("."))
        if problems:
            raise ConfigurationError("Retention settings refused: " + "; ".join(problems) + ".")
        return cls(**values)


def days_problem(days: object, name: str) -> str | None:
    """What is wrong with a period, if anything."""
    if days is None:
        return None
    return whole_problem(days, name, MAX_DAYS)


def whole_problem(value: object, name: str, most: int | None, least: int = 1) -> str | None:
    """What is wrong with a whole number that must be at least `least` (and at most `most`)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{name} must be a whole number, not {value!r}"
    if value < least or (most is not None and value > most):
        bound = f"from {least} to {most}" if most is not None else f"at least {least}"
        return f"{name} must be {bound}, not {value}"
    return None
