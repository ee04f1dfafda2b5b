"""What a step returns: the next thing its run should do.

A step returns another step (run it now), `wake_in(step, delay)` (run it
later), or None (the run stops). Anything else fails the attempt with an
error that says what came back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeAlias

from engine.errors import NotADirectiveError
from engine.steps import Call, Step, as_call, check_owner


@dataclass(frozen=True)
class RunNow:
    """Run `call` straight away."""

    call: Call[Any]


@dataclass(frozen=True)
class WakeIn:
    """Run `call` once `delay` has passed on the database clock."""

    call: Call[Any]
    delay: timedelta


Directive: TypeAlias = RunNow | WakeIn


def wake_in(target: Step[Any, Any] | Call[Any], delay: timedelta) -> WakeIn:
    """Run `target` after `delay`, measured on the database clock."""
    if not isinstance(delay, timedelta):
        raise TypeError(f"wake_in() needs a timedelta delay, not {type(delay).__name__}.")
    return WakeIn(as_call(target), max(delay, timedelta(0)))


def read_directive(value: object, workflow: type[Any], step_name: str) -> Directive | None:
    """Interpret what step `step_name` of `workflow` returned."""
    if value is None:
        return None
    if isinstance(value, Step | Call):
        value = RunNow(as_call(value))
    if isinstance(value, RunNow | WakeIn):
        check_owner(value.call, workflow)
        return value
    raise NotADirectiveError(
        f"Step {workflow.__name__}.{step_name} returned {value!r} ({type(value).__name__}), "
        "which is not a directive: return a step, a call of one, wake_in(...) or None."
    )
