"""A move's notifications as events: `state_assignment` and `state_completion`.

Event ids derive from the visit or the instance, so a retried transaction
cannot publish twice. A `DatabaseEventRegistry` stores them in the move's own
transaction; any other registry is told after the commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Select, Text, bindparam, event as sa_event, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from engine.base.errors import NotConnectedError
from engine.events.configure import get_event_registry
from engine.events.database import DatabaseEventRegistry
from engine.events.event import WorkflowEvent
from engine.events.routing import EventRegistry
from engine.graphs.design.model import Graph, Node
from engine.graphs.moves.states import InstanceState
from engine.graphs.tables import STATE, GraphTables
from engine.model.connection import current_connection

log = logging.getLogger("duly.graphs")

STATE_ASSIGNMENT = "duly.graph.state_assignment"
STATE_COMPLETION = "duly.graph.state_completion"
EVENT_NAMES = {STATE_ASSIGNMENT: "state_assignment", STATE_COMPLETION: "state_completion"}
SOURCE = "duly.graphs"

# Events published after a commit, kept referenced until their task is done.
_publishing: set[asyncio.Task[None]] = set()


def assignment_event(
    instance: InstanceState,
    graph: Graph,
    node: Node,
    branch_id: uuid.UUID,
    visit_id: uuid.UUID,
    assignees: Sequence[str],
    assignment_template: str | None,
) -> WorkflowEvent:
    """`node`'s assignees have work: the branch entered it (visit `visit_id`); the template
    their notification is written from (`assignment_template_of`)."""
    payload = {
        **_instance_payload(instance, graph),
        "state_code": node.state_code,
        "node_id": str(node.id),
        "node_name": node.title,
        "branch_id": str(branch_id),
        "visit_id": str(visit_id),
        "assignees": list(assignees),
        "assignment_template": assignment_template,
        "notify_originator": node.notify_originator,
    }
    return _event(STATE_ASSIGNMENT, uuid.uuid5(visit_id, STATE_ASSIGNMENT), payload)


@lru_cache(maxsize=64)
def active_assignment_template_statement(tables: GraphTables) -> Select[Any]:
    """The assignment template a state of :state_code names in the active version of :name."""
    templates, nodes = tables.table("template"), tables.table("node")
    return (
        select(nodes.c.assignment_template)
        .select_from(nodes.join(templates, nodes.c.template_id == templates.c.id))
        .where(
            templates.c.name == bindparam("name", type_=Text()),
            templates.c.is_active,
            nodes.c.node_type == STATE,
            nodes.c.state_code == bindparam("state_code", type_=Text()),
            nodes.c.assignment_template.is_not(None),
        )
        .order_by(nodes.c.order, nodes.c.key)
        .limit(1)
    )


async def assignment_template_of(
    conn: AsyncConnection, tables: GraphTables, graph: Graph, node: Node
) -> str | None:
    """The template an assignment to `node` names: the state's own, else the one the active
    version names for the same state code (an instance pinned to an older version is told
    as a new one would be), else None (the workflow's own)."""
    if node.assignment_template is not None or node.state_code is None:
        return node.assignment_template
    params = {"name": graph.name, "state_code": node.state_code}
    found = await conn.execute(active_assignment_template_statement(tables), params)
    template: str | None = found.scalar()
    return template


def completion_event(
    instance: InstanceState, graph: Graph, state_code: str | None
) -> WorkflowEvent:
    """The instance finished in `state_code`: its originator is told."""
    payload = {
        **_instance_payload(instance, graph),
        "state_code": state_code,
        "recipients": [instance.submitted_by] if instance.submitted_by else [],
    }
    return _event(STATE_COMPLETION, uuid.uuid5(instance.id, STATE_COMPLETION), payload)


def _instance_payload(instance: InstanceState, graph: Graph) -> dict[str, Any]:
    return {
        "instance_id": str(instance.id),
        "template_id": str(graph.template_id),
        "workflow": graph.name,
        "version": graph.version,
        "subject_type": instance.subject_type,
        "subject_key": instance.subject_key,
        "originator": instance.submitted_by,
    }


def _event(event_type: str, event_id: uuid.UUID, payload: dict[str, Any]) -> WorkflowEvent:
    return WorkflowEvent(
        event_type=event_type,
        event_name=EVENT_NAMES[event_type],
        payload=payload,
        event_id=str(event_id),
        source=SOURCE,
    )


def chosen_registry(registry: EventRegistry | None) -> EventRegistry:
    """The registry events go to: the runtime's own, else the process's."""
    return registry if registry is not None else get_event_registry()


async def publish_in_transaction(
    conn: AsyncConnection, registry: EventRegistry, events: Sequence[WorkflowEvent]
) -> bool:
    """Write `events` in `conn`'s transaction if `registry` stores them; whether it did."""
    if not events or not isinstance(registry, DatabaseEventRegistry):
        return False
    await registry.publish_many(events, session=conn)
    return True


async def publish_now(registry: EventRegistry, events: Sequence[WorkflowEvent]) -> None:
    """Route `events` through a registry that does not store them (after the commit)."""
    for item in events:
        try:
            await registry.publish(item)
        except Exception:  # the transition is committed; a handler's failure is its own
            log.exception("graph notification %s (%s) failed", item.event_id, item.event_type)


def kick_outbox(registry: EventRegistry) -> None:
    """Tell this process's workers the outbox has rows (after the commit that wrote them)."""
    if not isinstance(registry, DatabaseEventRegistry):
        return
    # Nobody connected here to tell: the NOTIFY that went with the rows tells the rest.
    with contextlib.suppress(NotConnectedError):
        current_connection().kick(registry.tables().outbox_table.name)


def publish_after_caller_commits(
    transaction: AsyncSession | AsyncConnection,
    registry: EventRegistry,
    events: Sequence[WorkflowEvent],
) -> None:
    """Route `events` once the caller's transaction commits; forget them if it rolls back.

    A session is told after its commit. A bare connection has no such event:
    its events are routed as its COMMIT is sent, so a handler reading the
    database from elsewhere may look a moment too early.
    """
    if not events:
        return
    loop = asyncio.get_running_loop()
    settled: list[bool] = []  # the first of the commit and the rollback decides

    def start(*_: Any) -> None:
        if settled:
            return
        settled.append(True)
        task = loop.create_task(publish_now(registry, list(events)))
        _publishing.add(task)
        task.add_done_callback(_publishing.discard)

    def forget(*_: Any) -> None:
        settled.append(False)

    # Each listener runs once (a listener cannot remove itself while its event runs).
    if isinstance(transaction, AsyncSession):
        sa_event.listen(transaction.sync_session, "after_commit", start, once=True)
        sa_event.listen(transaction.sync_session, "after_rollback", forget, once=True)
    else:
        sa_event.listen(transaction.sync_connection, "commit", start, once=True)
        sa_event.listen(transaction.sync_connection, "rollback", forget, once=True)
