"""The event layer's settings, read from `DULY_*` environment variables with the seed's
names, defaults and minimums.

    DULY_MODE                              local (default) or production
    DULY_ASYNC                             deliver through the outbox after commit
                                           (default: on in production, off locally)
    DULY_DEAD_LETTER_ENABLED               move an event to dead letter after its
                                           last retry (default on)
    DULY_SIGNAL_BRIDGE                     publish model changes (default off)
    DULY_EVENT_REGISTRY                    the registry: a dotted path, or JSON
                                           {"class": ..., "options": {...}}
                                           (default: by mode; see engine.events.configure)
    DULY_WORKFLOW_ENGINE                   the execution engine, the same way
    DULY_OUTBOX_BATCH_SIZE                 100, at least 1: outbox rows a drain claims
    DULY_OUTBOX_PROCESS_CHUNK_SIZE         50, at least 1: rows routed per chunk
    DULY_OUTBOX_CLAIM_TTL_SECONDS          300, at least 1: a claim's lease
    DULY_MAX_RETRIES                       3, at least 0: failed drains before dead letter
    DULY_RETRY_BACKOFF_SECONDS             5, at least 1: times the attempts, before a retry
    DULY_DELIVERY_RUNNING_TIMEOUT_SECONDS  300, at least 1: a delivery attempt's lease

Where the seed reads Django settings with `bool(...)`, an environment
variable is text, and `bool("false")` would be True: booleans here read
1/true/yes/on and 0/false/no/off (any case), and anything else is a
`ConfigurationError` naming the variable. Whole numbers follow the seed: a
value below its minimum is raised to it, and one that does not parse gives
the default (with a warning in the log). An empty variable counts as unset.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import ConfigurationError

log = logging.getLogger("duly.settings")

PRODUCTION = "production"
LOCAL = "local"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

# name: (default, minimum)
WHOLE_NUMBERS: dict[str, tuple[int, int]] = {
    "DULY_OUTBOX_BATCH_SIZE": (100, 1),
    "DULY_OUTBOX_PROCESS_CHUNK_SIZE": (50, 1),
    "DULY_OUTBOX_CLAIM_TTL_SECONDS": (300, 1),
    "DULY_MAX_RETRIES": (3, 0),
    "DULY_RETRY_BACKOFF_SECONDS": (5, 1),
    "DULY_DELIVERY_RUNNING_TIMEOUT_SECONDS": (300, 1),
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
        env = os.environ if environ is None else environ
        mode = read_mode(env.get("DULY_MODE"))
        numbers = {
            name.removeprefix("DULY_").lower(): read_whole_number(env, name)
            for name in WHOLE_NUMBERS
        }
        return cls(
            mode=mode,
            async_delivery=read_flag(env, "DULY_ASYNC", default=mode == PRODUCTION),
            dead_letter_enabled=read_flag(env, "DULY_DEAD_LETTER_ENABLED", default=True),
            signal_bridge=read_flag(env, "DULY_SIGNAL_BRIDGE", default=False),
            event_registry=env.get("DULY_EVENT_REGISTRY", "").strip() or None,
            workflow_engine=env.get("DULY_WORKFLOW_ENGINE", "").strip() or None,
            **numbers,
        )


def read_mode(value: str | None) -> str:
    """`production` when the value says so once stripped and lowercased; otherwise `local`."""
    return PRODUCTION if (value or "").strip().lower() == PRODUCTION else LOCAL


def read_flag(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    """A yes/no variable; unset or empty is `default`."""
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ConfigurationError(
        f"{name} must be one of {', '.join(sorted(TRUE_WORDS | FALSE_WORDS))}, not {env[name]!r}."
    )


def read_whole_number(env: Mapping[str, str], name: str) -> int:
    """A whole-number variable: its default when unset or unparsable, its minimum at least."""
    default, minimum = WHOLE_NUMBERS[name]
    value = env.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        log.warning("%s=%r is not a whole number; using %d.", name, value, default)
        return default
    return max(number, minimum)
