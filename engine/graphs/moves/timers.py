"""Approval deadlines as the engine's own timers: one workflow row per visit that has one.

The `GraphTimer` row's one step, `expire`, is due at the visit's deadline and
escalates through the runtime registered for its table, only while the visit
is still current.

    class Timer(Base, GraphTimer): pass              # duly_graph_timers
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

from sqlalchemy import ForeignKey, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from engine.base.errors import ConfigurationError
from engine.graphs.design.model import Node
from engine.graphs.moves.dispatch import dispatch, finish
from engine.graphs.moves.history import state_name
from engine.graphs.moves.states import BranchState
from engine.graphs.moves.unit import Unit
from engine.graphs.tables import BRANCHES, COMPLETED, INSTANCES, STATUS_CHANGE, TIMERS, VISITS
from engine.model.application import ambient_application, current_application
from engine.model.registry import EngineOwned, workflow_info
from engine.model.steps import step
from engine.runs.workflow import Workflow

log = logging.getLogger("duly.graphs")

ESCALATION_RETRIES = 5  # a failed escalation (a lost connection, say) is tried again

# instance id, branch id, visit id: what an expired timer hands its runtime.
Escalation = Callable[[uuid.UUID, uuid.UUID, uuid.UUID], Awaitable[object]]


class GraphTimer(Workflow, EngineOwned):
    """Map onto your base: one approval deadline, due work for the engine's workers."""

    __tablename__ = TIMERS
    # The graph's history records what an escalation did; a step log would say less.
    __workflow_attempt_log__ = False

    visit_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey(f"{VISITS}.id", ondelete="CASCADE"), primary_key=True
    )
    instance_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey(f"{INSTANCES}.id", ondelete="CASCADE"), index=True
    )
    branch_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey(f"{BRANCHES}.id", ondelete="CASCADE")
    )

    @step(retries=ESCALATION_RETRIES)
    async def expire(self) -> None:
        """The visit's deadline passed: escalate it if it is still waiting (else nothing)."""
        escalate = escalation_for(workflow_info(type(self)).name)
        await escalate(self.instance_id, self.branch_id, self.visit_id)


def register_escalation(timer_table: str, escalate: Escalation) -> None:
    """Have `escalate` run the expired timers of `timer_table` for the current application."""
    ambient_application().escalations[timer_table] = escalate


def escalation_for(timer_table: str) -> Escalation:
    """The escalation the current application registered for `timer_table`."""
    app = current_application()
    found: Escalation | None = app.escalations.get(timer_table) if app is not None else None
    if found is None:
        raise ConfigurationError(
            f"No GraphRuntime serves the timers of {timer_table!r} in this application: give "
            "the application its GraphRuntime before its workers run."
        )
    return found


async def escalate_visit(unit: Unit, branch: BranchState, source: Node) -> bool:
    """Move `branch` from `source` along its escalation edge, as the system; whether it moved.

    The visit's own timer is the one running: the engine finishes it when
    its step returns, so this transaction leaves it alone.
    """
    edge = next((e for e in unit.graph.outgoing(source.id) if e.escalation), None)
    if edge is None:
        log.warning(
            "graph %s v%s: the deadline of %r passed but it has no escalation transition",
            unit.graph.name,
            unit.graph.version,
            source.title,
        )
        return False
    target = unit.graph.node(edge.target_id)
    visit_id = branch.visit_id
    unit.spared_timer = visit_id
    branch.last_code = source.state_code
    unit.end_visit(branch, COMPLETED)
    unit.record(
        STATUS_CHANGE,
        f"The deadline of {source.title!r} passed: escalated to {target.title!r}.",
        source,
        visit_id,
        state_code=source.state_code,
        from_state=state_name(source),
        to_state=state_name(target),
        to_state_type=target.node_type,
        target_state_id=target.id,
        branch_id=branch.id,
        escalated=True,
    )
    finish(unit, await dispatch(unit, branch, target))
    return True
