"""What a delivery answers: how many runs accepted the event, and why the others refused it.

`Delivery` is an int (the count `deliver` always returned) that also carries the
refusals by reason; the sentence says them as an operator reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

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
    """How many runs accepted an event, with `refused`: the others counted by reason."""

    refused: dict[str, int]

    def __new__(cls, accepted: int, refused: Mapping[str, int] | None = None) -> Delivery:
        delivery = super().__new__(cls, accepted)
        delivery.refused = dict(sorted((refused or {}).items()))
        return delivery

    @property
    def accepted(self) -> int:
        """The count as a plain int."""
        return int(self)

    def explanation(self) -> str:
        """A sentence for people: how many took the event and why the rest did not."""
        took = f"{self.accepted} run{'' if self.accepted == 1 else 's'} accepted the event"
        if not self.refused:
            return f"{took}." if self.accepted else "No run matched: nothing was delivered."
        reasons = "; ".join(
            f"{REFUSAL_REASONS.get(reason, reason)} ({count})"
            for reason, count in self.refused.items()
        )
        return f"{took}; {sum(self.refused.values())} refused it: {reasons}."

    def __repr__(self) -> str:
        return f"Delivery({self.accepted}, refused={self.refused!r})"
