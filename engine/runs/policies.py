"""A schedule's policies: missed firings, overlapping ones, and whether a failure ends it.

`plan_firing` decides, when a firing ends (committed or finally failed), when
the run fires next: a catch-up occurrence due now, or the schedule's next
occurrence after now. The state it needs (the occurrence a firing serves, up
to when occurrences were judged, the catch-ups still owed) travels in the
schedule's entry in `next_args`. Why: docs/architecture.md, "Schedules and
refused deliveries".
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from engine.base.cron import Cron
from engine.base.errors import InvalidArgumentError

Missed = Literal["skip", "once", "each"]
Overlap = Literal["skip", "queue"]
MAX_CATCH_UP = 1000  # most missed firings `missed="each"` makes up
WALK_LIMIT = 10_000  # occurrences of a cron or function walked at most to count missed ones
# The keys of an entry a firing rewrites: its policy and the state of its firings.
POLICY_KEYS = ("missed", "up_to", "overlap", "stop_on_failure")
STATE_KEYS = frozenset((*POLICY_KEYS, "occurrence", "judged", "behind", "started", "paused", "due"))
Following = Callable[[datetime], datetime]  # the first occurrence strictly after an instant


@dataclass(frozen=True)
class SchedulePolicy:
    """What a schedule does with missed firings, overlapping ones and a failed one."""

    missed: Missed = "skip"
    up_to: int = 1  # with missed="each": how many missed firings are made up at most
    overlap: Overlap = "skip"
    stop_on_failure: bool = False

    def entry(self) -> dict[str, Any]:
        """The keys a schedule's entry stores for this policy: only those not the default."""
        stored: dict[str, Any] = {}
        if self.missed != "skip":
            stored["missed"] = self.missed
        if self.missed == "each":
            stored["up_to"] = self.up_to
        if self.overlap != "skip":
            stored["overlap"] = self.overlap
        if self.stop_on_failure:
            stored["stop_on_failure"] = True
        return stored

    @property
    def catching_up(self) -> bool:
        """Whether firings are counted at all: the default skips, and walks nothing."""
        return self.missed != "skip" or self.overlap != "skip"


DEFAULT_POLICY = SchedulePolicy()


def schedule_policy(missed: object, up_to: object, overlap: object, stop: object) -> SchedulePolicy:
    """The policy `every(...)` was given, checked: an InvalidArgumentError names what is wrong."""
    if missed not in get_args(Missed):
        raise InvalidArgumentError(
            f"every() takes missed='skip', 'once' or 'each', not {missed!r}."
        )
    if overlap not in get_args(Overlap):
        raise InvalidArgumentError(f"every() takes overlap='skip' or 'queue', not {overlap!r}.")
    if not isinstance(stop, bool):
        raise InvalidArgumentError(f"every() takes stop_on_failure=True or False, not {stop!r}.")
    if missed == "each":
        if isinstance(up_to, bool) or not isinstance(up_to, int) or not 1 <= up_to <= MAX_CATCH_UP:
            raise InvalidArgumentError(
                f"every(..., missed='each') needs up_to=N, a whole number from 1 to "
                f"{MAX_CATCH_UP}: how many missed firings to make up, not {up_to!r}."
            )
        return SchedulePolicy("each", up_to, overlap, stop)  # type: ignore[arg-type]
    if up_to is not None:
        raise InvalidArgumentError("every() takes up_to only with missed='each'.")
    return SchedulePolicy(missed, 1, overlap, stop)  # type: ignore[arg-type]


def policy_of(entry: Mapping[str, Any]) -> SchedulePolicy:
    """The policy a stored entry says (the default for keys it lacks)."""
    return SchedulePolicy(
        entry.get("missed", "skip"),
        int(entry.get("up_to", 1)),
        entry.get("overlap", "skip"),
        bool(entry.get("stop_on_failure", False)),
    )


@dataclass(frozen=True)
class Plan:
    """When the run fires next, the occurrence that firing serves, the catch-ups behind it."""

    wake_at: datetime
    behind: tuple[datetime, ...] = ()

    def entry(self, judged: datetime | None) -> dict[str, Any]:
        """The entry's keys for this plan; `judged` only for a policy that counts firings."""
        stored: dict[str, Any] = {"occurrence": self.wake_at.isoformat()}
        if judged is not None:
            stored["judged"] = judged.isoformat()
        if self.behind:
            stored["behind"] = [at.isoformat() for at in self.behind]
        return stored


def on_grid(interval: timedelta, anchor: datetime) -> Following:
    """An interval's occurrences: `anchor` plus whole intervals."""

    def following(at: datetime) -> datetime:
        return anchor + interval * (max((at - anchor) // interval, -1) + 1)

    return following


def occurrences(
    following: Following, after: datetime, upto: datetime, limit: int
) -> list[datetime]:
    """The latest `limit` occurrences in (`after`, `upto`], oldest first."""
    found: deque[datetime] = deque(maxlen=limit)
    at = following(after)
    for _ in range(WALK_LIMIT):
        if at > upto:
            break
        found.append(at)
        later = following(at)
        if later <= at:
            break
        at = later
    return list(found)


def plan_firing(
    following: Following,
    policy: SchedulePolicy,
    served: datetime,
    started: datetime,
    now: datetime,
    entry: Mapping[str, Any],
) -> Plan:
    """Where a firing that served `served`, began at `started` and ends `now` leaves its run.

    Missed occurrences passed before the firing began; overlapping ones while
    it ran or retried. Each policy adds catch-ups, due now, oldest first;
    without any, the run waits for the first occurrence after `now`.
    """
    judged = _instant(entry.get("judged"))
    seen = max(served, judged) if judged is not None else served
    owed = [_at(text) for text in entry.get("behind", ())]
    cap = 0
    if policy.missed != "skip":
        cap = 1 if policy.missed == "once" else policy.up_to
        owed += occurrences(following, seen, started, cap)
    if policy.overlap == "queue":
        cap += 1
        owed += occurrences(following, max(seen, started), now, 1)
    owed = owed[-cap:] if cap else []
    if owed:
        return Plan(owed[0], tuple(owed[1:]))
    return Plan(following(max(served, now)))


def firing_entry(
    described: Mapping[str, Any], policy: SchedulePolicy, plan: Plan, now: datetime, paused: bool
) -> tuple[dict[str, Any], datetime | None]:
    """The entry a firing leaves, and its run's wake_at (None while paused)."""
    entry = {key: value for key, value in described.items() if key not in STATE_KEYS}
    entry |= policy.entry() | plan.entry(now if policy.catching_up else None)
    if paused:  # a paused run fired by a trigger stays paused, holding its next occurrence
        return entry | {"paused": True, "due": plan.wake_at.isoformat()}, None
    return entry, plan.wake_at


def served_by(entry: Mapping[str, Any], scheduled_at: datetime | None) -> datetime | None:
    """The occurrence a firing serves: the entry's, else when its row came due."""
    return _instant(entry.get("occurrence")) or scheduled_at


def started_by(entry: Mapping[str, Any], claimed_at: datetime | None) -> datetime | None:
    """When a firing began: its first attempt's claim, kept in the entry while it retries."""
    return _instant(entry.get("started")) or claimed_at


def stored_following(entry: Mapping[str, Any], served: datetime) -> Following | None:
    """A stored schedule's occurrences: an interval or cron rebuilt, a module's function
    found among the modules loaded; None for one that cannot be found (a lambda, a closure).
    """
    if "interval" in entry:
        return on_grid(timedelta(seconds=float(entry["interval"])), served)
    if "cron" in entry:
        return Cron(entry["cron"], entry.get("zone", "UTC"))
    named = entry.get("function")
    if not isinstance(named, str) or "<" in named:
        return None
    parts = named.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        found: Any = sys.modules.get(".".join(parts[:cut]))  # never imports what a row names
        for part in parts[cut:]:
            found = getattr(found, part, None)
        if callable(found):
            return _checked(found)
    return None


def _checked(schedule: Callable[[datetime], Any]) -> Following:
    def following(at: datetime) -> datetime:
        later = schedule(at)
        if not isinstance(later, datetime) or later.tzinfo is None or later <= at:
            raise InvalidArgumentError(
                f"The schedule returned {later!r}, not an aware time after {at.isoformat()}."
            )
        return later

    return following


def _instant(text: object) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) else None


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)
