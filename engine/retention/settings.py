"""How long duly keeps what it owns: `RetentionSettings`, read from `DULY_RETAIN_*` and
`DULY_PRUNE_*` (declared in `engine.base.settings`, with their defaults and bounds).

A period is a whole number of days from 1 to 36500, or `never` (that kind
is kept for good). Unlike the outbox's numbers, a bad value is never
replaced by a default: deleting on a period nobody chose is worse than not
starting, so every bad variable is named in one `ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.base import settings as variables
from engine.base.errors import ConfigurationError
from engine.base.settings import MAX_DAYS, MAX_PAUSE_MS, MAX_PRUNE_BATCH_SIZE as MAX_BATCH_SIZE

ATTEMPTS = "attempts"
EVENTS = "events"
EXECUTIONS = "executions"
KINDS = (ATTEMPTS, EVENTS, EXECUTIONS)
DEFAULT_DAYS = 30  # every kind's, as engine.base.settings declares it
DEFAULT_BATCH_SIZE = variables.PRUNE_BATCH_SIZE.default  # rows a batch deletes
# Milliseconds after a batch that deleted. Flat out (0), a prune of 1,000,000 attempt-log
# rows took 1.1 to 1.6 s here but its WAL delayed a worker's commits (claim p99 up to 4-5x);
# paused 100 ms, it takes about 20 s and the claim p99 stays within 1.3-1.4x (bench/prune.py).
DEFAULT_PAUSE_MS = variables.PRUNE_PAUSE_MS.default
DEFAULT_DRAIN_BATCHES = variables.PRUNE_DRAIN_BATCHES.default  # per table, a drain's pass


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
        problems: list[str] = []
        values: dict[str, Any] = {}
        for name, setting in READ_FROM.items():
            if setting.text(environ) is None:
                continue  # the field's own default
            try:
                values[name] = setting.read(environ)
            except ConfigurationError as exc:
                problems.append(str(exc).rstrip("."))
        if problems:
            raise ConfigurationError("Retention settings refused: " + "; ".join(problems) + ".")
        return cls(**values)


# Each field, and the variable it is read from.
READ_FROM: dict[str, variables.Setting[Any]] = {
    "attempts_days": variables.RETAIN_ATTEMPTS_DAYS,
    "events_days": variables.RETAIN_EVENTS_DAYS,
    "executions_days": variables.RETAIN_EXECUTIONS_DAYS,
    "batch_size": variables.PRUNE_BATCH_SIZE,
    "pause_ms": variables.PRUNE_PAUSE_MS,
    "drain_batches": variables.PRUNE_DRAIN_BATCHES,
    "prune_on_drain": variables.PRUNE_ON_DRAIN,
}


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
