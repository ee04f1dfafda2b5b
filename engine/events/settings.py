"""The event layer's settings: `EventSettings.from_env` reads its `DULY_*` variables.

The variables, their defaults and minimums are declared in `engine.base.settings`.
Yes/no variables read 1/true/yes/on and 0/false/no/off (any case), and
anything else is a `ConfigurationError` naming the variable (an environment
variable is text, and `bool("false")` would be True). Whole numbers below
their minimum are raised to it, and one that does not parse gives the
default (with a warning in the log). An empty variable counts as unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.base import settings as variables
from engine.base.settings import FALSE_WORDS, LOCAL, PRODUCTION, TRUE_WORDS

__all__ = ["FALSE_WORDS", "LOCAL", "PRODUCTION", "TRUE_WORDS", "EventSettings", "read_mode"]

# The whole numbers, by the field each fills.
WHOLE_NUMBERS: dict[str, variables.Setting[int]] = {
    "outbox_batch_size": variables.OUTBOX_BATCH_SIZE,
    "outbox_process_chunk_size": variables.OUTBOX_PROCESS_CHUNK_SIZE,
    "outbox_claim_ttl_seconds": variables.OUTBOX_CLAIM_TTL_SECONDS,
    "max_retries": variables.MAX_RETRIES,
    "retry_backoff_seconds": variables.RETRY_BACKOFF_SECONDS,
    "delivery_running_timeout_seconds": variables.DELIVERY_RUNNING_TIMEOUT_SECONDS,
}


@dataclass(frozen=True)
class EventSettings:
    """How events are published, drained, retried and dead-lettered."""

    mode: str = LOCAL
    async_delivery: bool = False
    dead_letter_enabled: bool = True
    signal_bridge: bool = False
    outbox_batch_size: int = 100
    outbox_process_chunk_size: int = 50
    outbox_claim_ttl_seconds: int = 300
    max_retries: int = 3
    retry_backoff_seconds: int = 5
    delivery_running_timeout_seconds: int = 300
    event_registry: str | None = None  # as written: resolved by engine.events.configure
    workflow_engine: str | None = None  # as written: resolved by engine.executions.configure

    @property
    def production(self) -> bool:
        """Whether the mode is production (the outbox and durable engine by default)."""
        return self.mode == PRODUCTION

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EventSettings:
        """Read the DULY_* variables (os.environ unless given)."""
        mode = variables.MODE.read(environ)
        async_delivery = variables.ASYNC.read(environ)
        return cls(
            mode=mode,
            async_delivery=mode == PRODUCTION if async_delivery is None else async_delivery,
            dead_letter_enabled=variables.DEAD_LETTER_ENABLED.read(environ),
            signal_bridge=variables.SIGNAL_BRIDGE.read(environ),
            event_registry=variables.EVENT_REGISTRY.read(environ),
            workflow_engine=variables.WORKFLOW_ENGINE.read(environ),
            **{name: setting.read(environ) for name, setting in WHOLE_NUMBERS.items()},
        )


def read_mode(value: str | None) -> str:
    """`production` when the value says so once stripped and lowercased; otherwise `local`."""
    return PRODUCTION if (value or "").strip().lower() == PRODUCTION else LOCAL
