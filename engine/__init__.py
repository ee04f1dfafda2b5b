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
    EventError,
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
from engine.events.bridge import (
    bridge_connected,
    connect_bridge,
    connect_bridge_from_settings,
    disconnect_bridge,
    model_change_event,
)
from engine.events.configure import (
    configure_event_registry,
    configure_event_registry_from_settings,
    get_event_registry,
)
from engine.events.database import DatabaseEventRegistry
from engine.events.event import (
    WorkflowEvent,
    model_created_event,
    model_deleted_event,
    model_updated_event,
)
from engine.events.outbox import WorkflowOutbox
from engine.events.records import WorkflowDeliveryAttempt, WorkflowEventRecord
from engine.events.routing import EventRegistry, InMemoryEventRegistry, Registration
from engine.events.settings import EventSettings
from engine.executions.configure import (
    WorkflowEngine,
    configure_workflow_engine,
    configure_workflow_engine_from_settings,
    get_workflow_engine,
)
from engine.executions.durable import DurableWorkflowEngine, WorkflowExecutionRecord
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
    "DatabaseEventRegistry",
    "DulyError",
    "DurableWorkflowEngine",
    "EventError",
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
    "WorkflowDeliveryAttempt",
    "WorkflowEngine",
    "WorkflowEvent",
    "WorkflowEventRecord",
    "WorkflowExecution",
    "WorkflowExecutionError",
    "WorkflowExecutionNotFoundError",
    "WorkflowExecutionRecord",
    "WorkflowOutbox",
    "WorkflowState",
    "bridge_connected",
    "child",
    "configure_event_registry",
    "configure_event_registry_from_settings",
    "configure_workflow_engine",
    "configure_workflow_engine_from_settings",
    "connect_bridge",
    "connect_bridge_from_settings",
    "connect_workflows",
    "disconnect_bridge",
    "every",
    "fan_out",
    "get_event_registry",
    "get_workflow_engine",
    "model_change_event",
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
