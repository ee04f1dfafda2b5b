"""The execution state model every engine shares, and its two frozen records.

pending, running and waiting are active; completed, failed and cancelled are
terminal. `resume` is valid only for a waiting execution, `cancel` only for
an active one. The records hold the mappings they are given as they are
(neither copied nor frozen): an engine that needs isolation copies first.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine.base.errors import InvalidWorkflowStateError


class WorkflowState(enum.StrEnum):
    """Where an execution stands."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATES = (WorkflowState.PENDING, WorkflowState.RUNNING, WorkflowState.WAITING)
TERMINAL_STATES = (WorkflowState.COMPLETED, WorkflowState.FAILED, WorkflowState.CANCELLED)

# Returns (or awaits to) a mapping, None, or wait_for_resume() (engine.executions.local).
DefinitionHandler = Callable[[Mapping[str, Any]], Awaitable[object] | object]


@dataclass(frozen=True)
class WorkflowDefinition:
    """A workflow an engine can run: its identity, version, and the handler that does it."""

    workflow_id: str
    handler: DefinitionHandler | None = None
    version: str = "1"
    description: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkflowExecution:
    """A snapshot of one execution of a definition."""

    execution_id: str
    workflow_id: str
    state: WorkflowState
    input_data: Mapping[str, Any] = field(default_factory=dict)
    output_data: Mapping[str, Any] = field(default_factory=dict)
    correlation_id: str | None = None
    started_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Whether the execution may still move (pending, running or waiting)."""
        return self.state in ACTIVE_STATES


def require_state(
    execution: WorkflowExecution, operation: str, expected: tuple[WorkflowState, ...]
) -> None:
    """Refuse `operation` unless the execution is in one of the `expected` states."""
    if execution.state not in expected:
        raise InvalidWorkflowStateError(
            f"Cannot {operation} execution {execution.execution_id}: it is "
            f"{execution.state.value}, and {operation} needs "
            f"{', '.join(state.value for state in expected)}.",
            execution_id=execution.execution_id,
            operation=operation,
            state=execution.state.value,
            expected=tuple(state.value for state in expected),
        )
