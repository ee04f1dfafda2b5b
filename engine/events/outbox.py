"""The outbox as a workflow: each row is a run of one step, `route`, which the workers claim.

An outbox row is due work like any workflow row: the engine's one claim takes it, its
retry time is its `wake_at` (so `on_idle` counts it), and its lease is the outbox's claim
TTL, renewed while the routes run. The step carries its event in its arguments, so a
claimed row is all a drain reads; once the row settles they are gone, and the event record
keeps the event.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from engine.events.configure import get_event_registry, routing_of
from engine.events.deliveries import delivery_log, delivery_rows
from engine.events.draining import drain_event, event_from_json
from engine.events.event import utc_now
from engine.events.records import OutboxColumns, tables_for
from engine.model.companions import commit_with
from engine.model.connection import current_connection
from engine.model.registry import EngineOwned
from engine.model.steps import step
from engine.model.telemetry import deliveries_recorded
from engine.runs.directives import WakeIn, wake_in
from engine.runs.workflow import Workflow

FIRST_CLAIM = 1  # a row's version once claimed for the first time: nothing recorded yet
BOOKKEEPING_RETRIES = 40  # attempts a drain's own database errors get (1 s, 2 s, ... 2 min)


class WorkflowOutbox(OutboxColumns, Workflow, EngineOwned):
    """Map onto your base: the outbox, whose rows the workers route to their handlers."""

    # Its delivery attempts are its log: a route step's attempt log row would say less.
    __workflow_attempt_log__ = False

    # A drain's own bookkeeping (the delivery records it reads, and writes between routes)
    # may meet a database that restarts: the attempt is tried again, a second apart and
    # then less often, for about an hour. A drain is idempotent (a route that succeeded is
    # never run again); giving up would leave the event unrouted for good.
    @step(
        retries=BOOKKEEPING_RETRIES, backoff=timedelta(seconds=1), max_backoff=timedelta(minutes=2)
    )
    async def route(self, event: dict[str, Any]) -> WakeIn | None:
        """Route the row's event once; settle the row, or come back after the backoff."""
        stored = event_from_json(event)
        routes, settings = routing_of(get_event_registry())
        table = tables_for(type(self)).delivery_table
        deliveries = delivery_log(
            current_connection().autocommit, table, settings.outbox_process_chunk_size
        )
        verdict = await drain_event(
            stored,
            routes.matching(stored),
            settings,
            deliveries,
            route_attempts=self.route_attempts,
            first_drain=self.wf_version == FIRST_CLAIM,
        )
        if verdict.deliveries:
            # Written by this step's own commit, so they land exactly when the row settles.
            commit_with(delivery_rows(table, verdict.deliveries))
            deliveries_recorded([d.status for d in verdict.deliveries])
        # Only what changed is set: the commit writes exactly the changed columns.
        self.status = verdict.status
        if verdict.route_attempts != self.route_attempts:
            self.route_attempts = verdict.route_attempts
        if verdict.error != self.error:
            self.error = verdict.error
        # Marks the column set: its commit writes the database's time, not this one.
        self.settled_at = utc_now()
        if verdict.retry_in is None:
            return None
        return wake_in(type(self).route(event), verdict.retry_in)
