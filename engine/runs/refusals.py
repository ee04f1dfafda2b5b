"""What a delivery answers: the runs that took the event now, those that hold it until they
wait for it, and the others' refusals by reason.

`Delivery` is an int (the count of runs that accepted the event, taken or held, which
`deliver` always returned) carrying the three counts apart; `explanation()` says them as an
operator reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

UNKNOWN_KEY = "unknown_key"  # no run has the key the delivery named
DEDUPLICATED = "deduplicated"  # the event's key was taken already: a resent event
MOVED_MEANWHILE = "moved_meanwhile"  # the run changed between the delivery and its reason
REFUSAL_REASONS = {
    UNKNOWN_KEY: "no run has this key",
    DEDUPLICATED: "the event's key was taken already (a resent event)",
    "waiting_for_other_step": "the run waits for another step's event",
    "deadline_passed": "the run's wait is past its deadline",
    "holding_another_event": "the run, on its way to a wait, holds another event already",
    "finished": "the run has finished (deliver with restart to start it again)",
    "failed": "the run failed and stopped (deliver with restart to start it again)",
    "cancelled": "the run was cancelled (deliver with restart to start it again)",
    MOVED_MEANWHILE: "the run changed while the delivery was judged: deliver again",
}


class Delivery(int):
    """What became of an event: `taken` (runs waiting for it go on now), `held` (runs on their
    way to a wait keep it until they wait for it) and `refused` (the others, by reason).

    Its int value is `accepted`, taken plus held; it is immutable.
    """

    taken: int
    held: int
    refused: dict[str, int]

    def __new__(
        cls, *, taken: int = 0, held: int = 0, refused: Mapping[str, int] | None = None
    ) -> Delivery:
        delivery = super().__new__(cls, taken + held)
        object.__setattr__(delivery, "taken", taken)
        object.__setattr__(delivery, "held", held)
        object.__setattr__(delivery, "refused", dict(sorted((refused or {}).items())))
        return delivery

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"A Delivery is immutable: {name} cannot be set.")

    @property
    def accepted(self) -> int:
        """The runs that took or hold the event, as a plain int."""
        return int(self)

    def to_dict(self) -> dict[str, Any]:
        """The counts as JSON for every door, with the sentence `explanation` says."""
        return {
            "accepted": self.accepted,
            "taken": self.taken,
            "held": self.held,
            "refused": dict(self.refused),
            "message": self.explanation(),
        }

    def explanation(self) -> str:
        """A sentence for people: what each run did with the event, one clause a kind."""
        clauses = []
        if self.taken:
            clauses.append(f"{_runs(self.taken)} took the event now")
        if self.held:
            they = "it waits" if self.held == 1 else "they wait"
            holds = "holds" if self.held == 1 else "hold"
            clauses.append(f"{_runs(self.held)} {holds} the event until {they} for it")
        if self.refused:
            clauses.append(f"{sum(self.refused.values())} refused it: {self._reasons()}")
        if not clauses:
            return "No run matched: nothing was delivered."
        if not self.accepted:
            clauses.insert(0, "No run took the event")
        return "; ".join(clauses) + "."

    def _reasons(self) -> str:
        said = {reason: REFUSAL_REASONS.get(reason, reason) for reason in self.refused}
        if len(said) == 1:
            return next(iter(said.values()))
        return "; ".join(f"{said[reason]} ({count})" for reason, count in self.refused.items())

    def __repr__(self) -> str:
        return f"Delivery(taken={self.taken}, held={self.held}, refused={self.refused!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_delivery, (self.taken, self.held, self.refused))


def _delivery(taken: int, held: int, refused: dict[str, int]) -> Delivery:
    return Delivery(taken=taken, held=held, refused=refused)


def _runs(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'}"
