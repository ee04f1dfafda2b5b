"""The app `duly drain` and `duly replay-dead-letters` load in tests/test_outbox_cli.py.

It maps the outbox tests' tables (tests/apps/outbox.py) and registers its
handlers at import on `get_event_registry()` without configuring a registry,
the plainest way an app can: the commands configure a DatabaseEventRegistry
that keeps these routes. Only the command's process imports it, so the test
process's own registry never sees them.
"""

from __future__ import annotations

import os

from engine import WorkflowEvent, get_event_registry
from tests.apps.outbox import Base, Delivery, Event, Outbox, record_run

__all__ = ["Base", "Delivery", "Event", "Outbox"]

FIXED = "OUTBOX_CLI_FIXED"  # set in a command's environment once the provider is back


async def ship(event: WorkflowEvent) -> None:
    """Ships the order: a row in handler_runs."""
    await record_run(event, "ship")


async def charge(event: WorkflowEvent) -> None:
    """Charges the order, failing while the provider is down (FIXED unset)."""
    if not os.environ.get(FIXED):
        raise ConnectionError("the payment provider is down")
    await record_run(event, "charge")


def names_an_order(event: WorkflowEvent) -> bool:
    """An order event names its order; one that does not is refused, not retried."""
    return "order" in event.payload


registry = get_event_registry()
registry.register("order.placed", ship, validator=names_an_order)
registry.register("order.charged", charge)
