"""How a worker runs: its options, checked when built, their defaults, and what a pass did."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from engine.base.errors import ConfigurationError
from engine.claims.next_due import NextDue
from engine.model.steps import DEFAULT_LANE
from engine.worker.idle import OnIdle

# The defaults of every worker, whichever way it is started.
MAX_CONCURRENCY = 8  # steps running at once
# Renewed every third while the step runs: a dead worker's runs are taken again within it.
LEASE = timedelta(seconds=30)
POLL_INTERVAL = timedelta(seconds=1)  # how often work held by others is looked at again
IDLE_INTERVAL = timedelta(seconds=30)  # the longest sleep of a listening worker
SUSPENDING_IDLE_INTERVAL = timedelta(hours=1)  # ... and of one under suspends_when_idle
SHUTDOWN_TIMEOUT = timedelta(seconds=10)  # for running steps to finish at shutdown


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs; every duration is a timedelta."""

    max_concurrency: int = MAX_CONCURRENCY
    lease: timedelta = LEASE
    poll_interval: timedelta = POLL_INTERVAL
    max_idle_interval: timedelta = IDLE_INTERVAL
    shutdown_timeout: timedelta = SHUTDOWN_TIMEOUT
    listen: bool = True
    on_idle: OnIdle | None = None
    listen_engine: AsyncEngine | None = None  # LISTEN through this engine, not the session's
    lanes: frozenset[str] = frozenset({DEFAULT_LANE})  # the lanes whose steps it takes

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ConfigurationError(
                f"max_concurrency must be at least 1, not {self.max_concurrency}."
            )
        for name in ("lease", "poll_interval", "max_idle_interval"):
            if getattr(self, name) <= timedelta(0):
                raise ConfigurationError(f"{name} must be a positive timedelta.")
        if self.shutdown_timeout < timedelta(0):
            raise ConfigurationError("shutdown_timeout must not be negative.")
        if not self.lanes or not all(isinstance(lane, str) and lane for lane in self.lanes):
            raise ConfigurationError(
                f"lanes must name at least one lane, not {sorted(self.lanes)!r}."
            )


@dataclass(frozen=True)
class PassResult:
    """What one pass did: how many rows it claimed of the slots it had, and what is next due."""

    claimed: int
    free: int
    upcoming: NextDue | None  # asked only when the pass took less than it had room for

    @property
    def filled(self) -> bool:
        """Every free slot was taken: there may be more due, so look again at once."""
        return self.claimed == self.free
