"""duly's engine: durable workflows where a workflow is an ordinary SQLAlchemy table.

Import everything from here; the modules behind it are private.
"""

from __future__ import annotations

from engine.attempt_log import AttemptLog
from engine.connection import connect_workflows
from engine.cron import Cron
from engine.directives import every, wait_for, wake_in
from engine.errors import (
    ActionAlreadyRegisteredError,
    ActionError,
    ActionExecutionError,
    ActionNotFoundError,
    ConfigurationError,
    DulyError,
    InvalidWorkflowStateError,
    NotADirectiveError,
    NotConnectedError,
    NotFoundError,
    NotRunningError,
    StepError,
    WorkflowExecutionError,
    WorkflowExecutionNotFoundError,
)
from engine.events.actions import Action, ActionRegistry
from engine.events.event import (
    WorkflowEvent,
    model_created_event,
    model_deleted_event,
    model_updated_event,
)
from engine.events.routing import EventRegistry, InMemoryEventRegistry, Registration
from engine.events.settings import EventSettings
from engine.executions.local import LocalWorkflowEngine, wait_for_resume
from engine.executions.state import WorkflowDefinition, WorkflowExecution, WorkflowState
from engine.fanout import child, fan_out
from engine.handles import Handle
from engine.limits import Limit, RateBucket
from engine.steps import Call, Step, step
from engine.worker import Worker, run_workflows, wake
from engine.workflow import Workflow

__all__ = [
    "Action",
    "ActionAlreadyRegisteredError",
    "ActionError",
    "ActionExecutionError",
    "ActionNotFoundError",
    "ActionRegistry",
    "AttemptLog",
    "Call",
    "ConfigurationError",
    "Cron",
    "DulyError",
    "EventRegistry",
    "EventSettings",
    "Handle",
    "InMemoryEventRegistry",
    "InvalidWorkflowStateError",
    "Limit",
    "LocalWorkflowEngine",
    "NotADirectiveError",
    "NotConnectedError",
    "NotFoundError",
    "NotRunningError",
    "RateBucket",
    "Registration",
    "Step",
    "StepError",
    "Worker",
    "Workflow",
    "WorkflowDefinition",
    "WorkflowEvent",
    "WorkflowExecution",
    "WorkflowExecutionError",
    "WorkflowExecutionNotFoundError",
    "WorkflowState",
    "child",
    "connect_workflows",
    "every",
    "fan_out",
    "model_created_event",
    "model_deleted_event",
    "model_updated_event",
    "run_workflows",
    "step",
    "wait_for",
    "wait_for_resume",
    "wake",
    "wake_in",
]
