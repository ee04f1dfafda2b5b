"""What a step returns: the next thing its run should do.

A step returns another step (run it now), `wake_in(step, delay)` (run it
later), `every(step, schedule)` (run it again on a schedule),
`wait_for(step, ...)` (run it when an event arrives), or None (the run
stops). Anything else fails the attempt with an error that says what came
back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias

from engine.base.errors import InvalidArgumentError, NotADirectiveError, StepError
from engine.model.steps import Call, Step, as_call, as_call_unchecked, check_owner
from engine.runs.fanout import FanOut
from engine.runs.policies import (
    DEFAULT_POLICY,
    Following,
    Missed,
    Overlap,
    SchedulePolicy,
    on_grid,
    schedule_policy,
)


@dataclass(frozen=True)
class RunNow:
    """Run `call` straight away."""

    call: Call[Any]


@dataclass(frozen=True)
class WakeIn:
    """Run `call` once `delay` has passed on the database clock."""

    call: Call[Any]
    delay: timedelta


Schedule: TypeAlias = timedelta | Callable[[datetime], datetime]


@dataclass(frozen=True)
class Every:
    """Run `call` again on `schedule`: an interval, a `Cron`, or any function of the time."""

    call: Call[Any]
    schedule: Schedule
    policy: SchedulePolicy = DEFAULT_POLICY

    def next_after(self, scheduled_at: datetime, now: datetime) -> datetime:
        """The next occurrence: strictly after `now` (the default policy: missed ones skipped).

        An interval counts from the occurrence this run served, not from when
        the step finished, so a slow step does not push the schedule later.
        """
        return self.following_from(scheduled_at)(max(scheduled_at, now))

    def following_from(self, served: datetime) -> Following:
        """The schedule's occurrences, an interval's on the grid of the occurrence `served`."""
        if isinstance(self.schedule, timedelta):
            return on_grid(self.schedule, served)
        return self._asked

    def _asked(self, at: datetime) -> datetime:
        following = self.schedule(at)  # type: ignore[operator]
        if not isinstance(following, datetime) or following.tzinfo is None:
            raise NotADirectiveError(
                f"The schedule of {self.call.step.qualname} returned {following!r}: it must "
                "return an aware datetime."
            )
        if following <= at:
            raise NotADirectiveError(
                f"The schedule of {self.call.step.qualname} returned {following.isoformat()}, "
                f"which is not after {at.isoformat()}."
            )
        return following


@dataclass(frozen=True)
class WaitFor:
    """Park until an event for `step` is delivered, or `timeout` passes and `on_timeout` runs."""

    step: Step[Any, Any]
    timeout: timedelta | None = None
    on_timeout: Call[Any] | None = None


Directive: TypeAlias = RunNow | WakeIn | Every | WaitFor | FanOut


def wake_in(target: Step[Any, Any] | Call[Any], delay: timedelta) -> WakeIn:
    """Run `target` after `delay`, measured on the database clock."""
    if not isinstance(delay, timedelta):
        raise StepError(f"wake_in() needs a timedelta delay, not {type(delay).__name__}.")
    return WakeIn(as_call(target), max(delay, timedelta(0)))


def every(
    target: Step[Any, Any] | Call[Any],
    schedule: Schedule,
    *,
    missed: Missed = "skip",
    up_to: int | None = None,
    overlap: Overlap = "skip",
    stop_on_failure: bool = False,
) -> Every:
    """Run `target` on `schedule`; `missed`, `overlap` and `stop_on_failure` are its policies.

    missed: "skip", "once" or "each" (with `up_to`); overlap: "skip" or "queue".
    """
    if isinstance(schedule, timedelta):
        if schedule <= timedelta(0):
            raise InvalidArgumentError(f"every() needs a positive interval, not {schedule}.")
    elif not callable(schedule):
        raise StepError(
            "every() takes a timedelta, a Cron, or a function of the current time, not "
            f"{type(schedule).__name__}."
        )
    policy = schedule_policy(missed, up_to, overlap, stop_on_failure)
    return Every(as_call(target), schedule, policy)


def wait_for(
    target: Step[Any, Any],
    timeout: timedelta | None = None,
    on_timeout: Step[Any, Any] | Call[Any] | None = None,
) -> WaitFor:
    """Wait for an event addressed to `target` (its arguments travel with the event)."""
    if not isinstance(target, Step):
        raise StepError(
            f"wait_for() takes the step that receives the event, not {target!r}: the "
            "arguments come with the event."
        )
    if (timeout is None) != (on_timeout is None):
        raise InvalidArgumentError("wait_for() takes timeout and on_timeout together, or neither.")
    if timeout is not None and timeout <= timedelta(0):
        raise InvalidArgumentError(f"wait_for() needs a positive timeout, not {timeout}.")
    return WaitFor(target, timeout, as_call(on_timeout) if on_timeout is not None else None)


def read_directive(value: object, workflow: type[Any], step_name: str) -> Directive | None:
    """Interpret what step `step_name` of `workflow` returned."""
    if value is None:
        return None
    if isinstance(value, Step | Call):
        value = RunNow(as_call(value))
    if isinstance(value, FanOut):
        check_owner(value.then, workflow)
        return value
    if isinstance(value, WaitFor):
        check_owner(as_call_unchecked(value.step), workflow)
        if value.on_timeout is not None:
            check_owner(value.on_timeout, workflow)
        return value
    if isinstance(value, RunNow | WakeIn | Every):
        check_owner(value.call, workflow)
        return value
    raise NotADirectiveError(
        f"Step {workflow.__name__}.{step_name} returned {value!r} ({type(value).__name__}), "
        "which is not a directive: return a step, a call of one, wake_in(...), every(...), "
        "wait_for(...), fan_out(...) or None."
    )
