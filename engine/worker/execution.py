"""Running one claimed step and committing what came of it.

The step's body runs with no transaction open; what it returned, the changes it made to
its row and its attempt record are then written in one fenced statement through the
worker's commit queue. A body that raised, or a commit the database refused, is a failed
attempt, retried on the step's policy, its traceback and arguments kept in the attempt log;
stored arguments that no longer bind to the step's signature are one failed attempt
whatever the policy, since every try would fail alike, and so is an error the step
names in `stop_on` (or a `StepFailed`). A plain `def` body runs in a worker thread; a
body past its step's `timeout` is a failed attempt (see `_within`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from engine.base.errors import InternalError, StepError, StepTimeoutError
from engine.base.scrubbing import scrub_secrets
from engine.claims.claim import Claim
from engine.commits.outcomes import AttemptRecord, Outcome, Write
from engine.model import telemetry
from engine.model.attempt_log import logged_key
from engine.model.companions import Collecting
from engine.model.rows import refresh_row, user_changes
from engine.model.steps import Call, RetryPolicy, Step, decode_arguments
from engine.runs.directives import Directive, Every, RunNow, WaitFor, WakeIn, read_directive
from engine.runs.fanout import FanOut
from engine.runs.policies import (
    Plan,
    firing_entry,
    plan_firing,
    policy_of,
    served_by,
    started_by,
    stored_following,
)
from engine.runs.schedules import SCHEDULE_ENTRY, schedule_entry
from engine.worker.committer import TRANSIENT_ERRORS, Committer
from engine.worker.failures import failure_arguments, failure_traceback

log = logging.getLogger("duly.worker")

RECENT_EVENT_KEYS = 16  # keys a run remembers, so a resent event is refused

ERROR_TEXT_LIMIT = 4000  # characters of an exception kept in last_error
SHOWN_ARGUMENTS = 300  # characters of stored arguments a signature mismatch quotes


@dataclass
class StepContext:
    """What running a step needs from the worker that claimed it."""

    committer: Committer
    lease: timedelta
    may_continue: Callable[[str], bool]  # may this worker run a step of this lane next?
    release_slot: Callable[[], None]  # the body is done: the worker may claim in its place
    release_preempted: Callable[[Claim], Awaitable[object]]  # a fenced step's lease, given up


Continuation = tuple[Claim, Any]


async def execute(ctx: StepContext, claim: Claim, row: Any) -> Continuation | None:
    """Run `row`'s next step and commit its outcome.

    Returns the claim and row to go on with when the step asked for another
    step now and this worker keeps the lease to run it; None otherwise.
    """
    info = claim.info
    step = info.resolve(row.next_step)
    # The name the step has in this code: a row may still carry one of its aliases.
    name = step.name if step is not None else row.next_step
    failures = row.attempts
    started = time.perf_counter()
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    # The engine's own steps (an outbox route, whose handlers record their deliveries as
    # they go) keep their effects apart: a handler's writes commit on their own.
    effects = ctx.committer.effects(joined=not info.engine_owned)

    async def fail(exc: BaseException) -> None:
        policy = step.retry if step is not None else RetryPolicy()
        stops = step is not None and isinstance(exc, step.stop_on)
        if stops:
            policy = RetryPolicy()  # an error the step says no retry can mend: the run stops
        elif isinstance(exc, TypeError) and step is not None:
            misfit = _misfit_arguments(step, row, args, kwargs)
            if misfit is not None:
                # Arguments stored for an older signature fail the same way every time.
                misfit.__cause__ = exc
                exc, policy = misfit, RetryPolicy()
        await _record_failure(ctx, claim, row, name, exc, failures + 1, policy, took, stops)

    try:
        if step is None:
            raise StepError(f"Workflow {info.cls.__name__} has no step {name!r}.")
        args, kwargs = decode_arguments(row.next_args)
        with (
            telemetry.step_span(info.name, name, failures + 1, row),
            Collecting() as attached,
            effects,
        ):
            body: Awaitable[object]
            if step.plain:  # to_thread copies the context: commit_with() there reaches `attached`
                body = asyncio.to_thread(step.fn, row, *args, **kwargs)
            else:
                body = step.fn(row, *args, **kwargs)  # type: ignore[assignment]
            limit = step.timeout
            result = await (body if limit is None else _within(step.qualname, limit, body))
        directive = read_directive(result, info.cls, name)
        took = _ms_since(started)
        keep = (
            isinstance(directive, RunNow)
            and ctx.may_continue(directive.call.step.lane)
            # Every start of a rate-limited workflow spends a token, so its next step
            # goes back through the claim rather than running on here.
            and (info.limit is None or info.limit.rate is None)
        )
        outcome = _outcome_for(directive, claim, ctx.lease if keep else None, row.next_args)
    except asyncio.CancelledError:
        await effects.discard()
        raise
    except Exception as exc:  # the body, what it returned, or its schedule: a failed attempt
        took = _ms_since(started)
        ctx.release_slot()
        await effects.discard()
        await fail(exc)
        return None
    if not keep:
        ctx.release_slot()
    changes, taken = user_changes(info, row), _taken_keys(row)
    if changes or taken is not None:  # most steps change neither: no copy to make
        outcome = replace(outcome, changes=changes, recent_event_keys=taken)
    write = Write(
        claim,
        outcome,
        # The record's key is text the attempt log keeps; a workflow without a log needs none.
        AttemptRecord(
            logged_key(claim.key) if info.logged else "", name, failures + 1, "ok", None, took
        ),
        announce=isinstance(directive, RunNow) and not keep,
        fan_out=directive if isinstance(directive, FanOut) else None,
        finishes_child_of=_parent_if_final(row, outcome),
        companions=tuple(attached),
    )
    try:
        if effects.written:  # what the body published, started or wrote commits with it
            written = await ctx.committer.write_with_effects(write, effects)
        else:
            written = await ctx.committer.write(write)
    except TRANSIENT_ERRORS:
        log.warning(
            "%s %s: no database to commit to; the row comes due again when its lease ends",
            _label(claim),
            name,
        )
        return None
    except SQLAlchemyError as exc:
        # The body succeeded but the database refused its commit: a failed attempt.
        await fail(exc)
        return None
    if written is None:
        log.info("%s %s: fenced, its row moved while the step ran", _label(claim), name)
        telemetry.attempt_finished(info.name, name, "fenced", took)
        await ctx.release_preempted(claim)
        return None
    if log.isEnabledFor(logging.INFO):  # its arguments cost more than the step, unlogged
        log.info("%s %s ok in %.1f ms%s", _label(claim), name, took, _describe(directive))
    telemetry.attempt_finished(info.name, name, "ok", took)
    if keep:
        refresh_row(info, row, written._mapping)
        # The next step is served now: its occurrence is the commit's own time.
        committed_at = written.claimed_until - ctx.lease
        going_on = Claim(
            info,
            claim.key,
            claim.version + 1,
            lease_end=written.claimed_until,
            scheduled_at=committed_at,
            claimed_at=committed_at,
        )
        return going_on, row
    return None


async def _within(qualname: str, limit: timedelta, body: Awaitable[object]) -> object:
    """What `body` returned, unless `limit` passes first: then a StepTimeoutError.

    The body is cancelled at the timeout; a thread (a plain step) cannot be, so
    its result is discarded, as is what a body that swallowed its cancellation
    returned. A TimeoutError the body raised itself is its own.
    """
    try:
        async with asyncio.timeout(limit.total_seconds()) as scope:
            result = await body
    except TimeoutError:
        if not scope.expired():
            raise
    else:
        if not scope.expired():
            return result
    raise StepTimeoutError(
        f"Step {qualname} did not finish within its timeout of {_duration(limit)}; "
        "the attempt was cancelled."
    )


def _duration(limit: timedelta) -> str:
    """`0.2 s`, `90 s`, `1:00:00`: a timeout as a message shows it."""
    seconds = limit.total_seconds()
    return f"{seconds:g} s" if seconds < 3600 else str(limit)


async def _record_failure(
    ctx: StepContext,
    claim: Claim,
    row: Any,
    name: str,
    exc: BaseException,
    failures: int,
    policy: RetryPolicy,
    took: float,
    stops: bool = False,  # a stop_on error: the run stops, on a schedule or not
) -> None:
    # What the run, its log and the worker's own log keep of the failure, its secrets scrubbed.
    error = scrub_secrets(f"{type(exc).__name__}: {exc}")[:ERROR_TEXT_LIMIT]
    trace = failure_traceback(exc)
    delay = policy.delay_after(failures)
    going_on = _schedule_goes_on(claim, row, error) if delay is None and not stops else None
    if going_on is not None:
        outcome, verdict = going_on, "failed"  # the schedule goes on to its next firing
    elif delay is None:
        outcome = Outcome(
            None,
            None,
            attempts=failures,
            last_error=error,
            pending="discard",
            recent_event_keys=_taken_keys(row),
        )
        verdict = "failed"
    else:
        # The same step again, with the same arguments, once the backoff has passed.
        outcome = Outcome(
            name,
            _retrying_args(claim, row),
            attempts=failures,
            last_error=error,
            wake_after=delay,
            recent_event_keys=_taken_keys(row),
        )
        verdict = "retry"
    # The traceback and arguments too, for whoever reads the history (never a frame's locals).
    record = AttemptRecord(
        logged_key(claim.key),
        name,
        failures,
        verdict,
        error,
        took,
        traceback=trace,
        args=failure_arguments(row.next_args) if claim.info.logged else None,
    )
    log.warning(
        "%s %s attempt %d %s: %s%s",
        _label(claim),
        name,
        failures,
        verdict,
        error,
        # A run given up logs its traceback, as scrubbed as the attempt log's.
        f"\n{trace.rstrip()}" if verdict == "failed" else "",
    )
    try:
        written = await ctx.committer.write(
            Write(claim, outcome, record, finishes_child_of=_parent_if_final(row, outcome))
        )
    except SQLAlchemyError:
        log.exception("%s %s: could not record the failed attempt", _label(claim), name)
        return
    telemetry.attempt_finished(claim.info.name, name, verdict if written else "fenced", took)


def _misfit_arguments(
    step: Step[Any, Any], row: Any, args: list[Any], kwargs: dict[str, Any]
) -> StepError | None:
    """The error to record when the stored arguments no longer bind to the step's signature.

    Asked only after a TypeError, so a step that runs costs nothing more; a
    TypeError raised inside a body whose arguments bind is left to the step's
    retry policy.
    """
    try:
        step.signature.bind(row, *args, **kwargs)
    except TypeError as exc:
        reason = str(exc)
    else:
        return None
    return StepError(
        f"Stored arguments for {step.qualname} no longer fit its signature ({reason}): "
        f"args={_shortened(args)}, kwargs={_shortened(kwargs)}; {_shown_signature(step)} "
        f"— run it again with by(...).run({step.qualname}(...)) or cancel()."
    )


class _Written(str):
    """An annotation kept as text (`from __future__ import annotations`), shown unquoted."""

    def __repr__(self) -> str:
        return str(self)


def _shown_signature(step: Step[Any, Any]) -> str:
    """`review(self, reviewer: str)`: the step's parameters as written, without its return."""
    parameters = [
        p.replace(annotation=_Written(p.annotation)) if isinstance(p.annotation, str) else p
        for p in step.signature.parameters.values()
    ]
    shown = step.signature.replace(parameters=parameters, return_annotation=inspect.Parameter.empty)
    return f"{step.name}{shown}"


def _shortened(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= SHOWN_ARGUMENTS else shown[: SHOWN_ARGUMENTS - 1] + "…"


def _outcome_for(
    directive: Directive | None,
    claim: Claim,
    hold: timedelta | None,
    served_args: dict[str, Any] | None,
) -> Outcome:
    """The engine columns a step's directive leaves on its row (before the row's own changes).

    `hold` is the lease kept when this worker runs the next step itself;
    `served_args` are the stored arguments of the step that ran.
    """
    if directive is None:
        return Outcome(next_step=None, next_args=None, pending="discard")
    if isinstance(directive, WakeIn):
        call = directive.call
        return Outcome(call.step.name, call.encoded, wake_after=directive.delay)
    if isinstance(directive, WaitFor):
        return _waiting(directive, claim)
    if isinstance(directive, FanOut):
        # Nothing scheduled until the last child finishes; the commit counts them.
        return Outcome(directive.then.step.name, directive.then.encoded)
    if isinstance(directive, Every):
        return _scheduled(directive, claim, served_args)
    call = directive.call
    return Outcome(call.step.name, call.encoded, wake_after=timedelta(0), hold=hold)


def _waiting(directive: WaitFor, claim: Claim) -> Outcome:
    """The row parked on an event: the timeout step is what is scheduled, at the deadline.

    The deadline also travels in next_args, because a claim of the timeout
    step moves wake_at to its lease, and a delivery must still be judged
    against the deadline itself.
    """
    if directive.timeout is None or directive.on_timeout is None:
        return Outcome(None, None, waiting_for=directive.step.name, pending="wait")
    now = claim.database_now()
    if now is None:
        raise InternalError("A wait with a timeout needs the time its claim was taken.")
    deadline = now + directive.timeout
    call = directive.on_timeout
    next_args = {**call.encoded, "deadline": deadline.isoformat()}
    return Outcome(
        call.step.name,
        next_args,
        wake_at=deadline,
        waiting_for=directive.step.name,
        pending="wait",
    )


def _scheduled(directive: Every, claim: Claim, served_args: dict[str, Any] | None) -> Outcome:
    """The row back on its schedule, which travels in next_args for the schedules view.

    A paused run fired by a trigger stays paused: nothing is due until it is resumed.
    """
    stored = _schedule_of(served_args) or {}
    now, served = claim.database_now(), served_by(stored, claim.scheduled_at)
    if now is None or served is None:
        raise InternalError("A scheduled step needs the time its claim was taken.")
    policy = directive.policy
    if policy.catching_up:
        started = started_by(stored, claim.claimed_at) or now
        following = directive.following_from(served)
        plan = plan_firing(following, policy, served, started, now, stored)
    else:
        plan = Plan(directive.next_after(served, now))
    described = schedule_entry(directive.schedule, claim.claimed_at)
    entry, wake_at = firing_entry(described, policy, plan, now, bool(stored.get("paused")))
    call = directive.call
    # Going back round a schedule drops a held event.
    return Outcome(
        call.step.name, {**call.encoded, SCHEDULE_ENTRY: entry}, wake_at=wake_at, pending="discard"
    )


def _schedule_goes_on(claim: Claim, row: Any, error: str) -> Outcome | None:
    """A scheduled firing that finally failed: its run on to the next firing, its failure
    kept in last_error; None when the schedule ends (stop_on_failure, or none to ask again)."""
    stored = _schedule_of(row.next_args)
    now = claim.database_now()
    served = served_by(stored or {}, claim.scheduled_at)
    if stored is None or stored.get("stop_on_failure") or now is None or served is None:
        return None
    following = stored_following(stored, served)
    if following is None:
        return None
    policy = policy_of(stored)
    started = started_by(stored, claim.claimed_at) or now
    try:
        plan = plan_firing(following, policy, served, started, now, stored)
    except Exception:  # a function schedule that raises now: the schedule ends, as it would
        log.exception("%s: its schedule could not be asked for its next firing", _label(claim))
        return None
    described = {**stored, "fired_at": claim.claimed_at.isoformat() if claim.claimed_at else None}
    entry, wake_at = firing_entry(described, policy, plan, now, bool(stored.get("paused")))
    return Outcome(
        row.next_step,
        {**row.next_args, SCHEDULE_ENTRY: entry},
        attempts=0,  # the next firing gets its own retries
        last_error=error,
        wake_at=wake_at,
        pending="discard",
        recent_event_keys=_taken_keys(row),
    )


def _retrying_args(claim: Claim, row: Any) -> dict[str, Any] | None:
    """A retried firing's arguments, its entry keeping when the firing's first attempt began."""
    stored = _schedule_of(row.next_args)
    if stored is None or "started" in stored or claim.claimed_at is None:
        return row.next_args  # type: ignore[no-any-return]
    started = {**stored, "started": claim.claimed_at.isoformat()}
    return {**row.next_args, SCHEDULE_ENTRY: started}


def _schedule_of(next_args: dict[str, Any] | None) -> dict[str, Any] | None:
    entry = (next_args or {}).get(SCHEDULE_ENTRY)
    return entry if isinstance(entry, dict) else None


def _parent_if_final(row: Any, outcome: Outcome) -> dict[str, Any] | None:
    """The parent to tell, when this outcome ends a child run (done or given up)."""
    finished = outcome.next_step is None and outcome.waiting_for is None
    parent: dict[str, Any] | None = row.parent
    return parent if finished and parent else None


def _taken_keys(row: Any) -> list[str] | None:
    """The run's recent event keys with this attempt's own, if it ran a keyed event."""
    key = (row.next_args or {}).get("event_key")
    if key is None:
        return None
    return [*(row.recent_event_keys or []), key][-RECENT_EVENT_KEYS:]


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _label(claim: Claim) -> str:
    key = claim.key[0] if len(claim.key) == 1 else claim.key
    return f"{claim.info.name}[{key}]"


def _describe(directive: RunNow | WakeIn | Every | WaitFor | FanOut | None) -> str:
    """What comes next, named by its steps: never their arguments (payloads, personal data)."""
    if directive is None:
        return ", run finished"
    if isinstance(directive, FanOut):
        return f", {len(directive.children)} children, then {_named(directive.then)}"
    if isinstance(directive, WaitFor):
        return f", waiting for {directive.step.qualname}"
    if isinstance(directive, Every):
        return f", next {_named(directive.call)} on its schedule"
    if isinstance(directive, WakeIn):
        return f", next {_named(directive.call)} in {directive.delay}"
    return f", next {_named(directive.call)}"


def _named(call: Call[Any]) -> str:
    """A call as a log line shows it: `Step.name()`, or `Step.name(…)` when it has arguments."""
    return f"{call.step.qualname}({'…' if call.args or call.kwargs else ''})"
