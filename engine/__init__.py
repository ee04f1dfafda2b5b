"""duly's engine: durable workflows where a workflow is an ordinary SQLAlchemy table.

Import everything from here; the modules behind it are private. Each name
is imported when it is first asked for (`from engine import Workflow` works
as any other import): a process pays for the parts it uses, so a Lambda wake
of plain workflows loads neither the event layer nor the graph layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Action",
    "ActionAlreadyRegisteredError",
    "ActionError",
    "ActionExecutionError",
    "ActionNotFoundError",
    "ActionRegistry",
    "Actor",
    "AlreadyVotedError",
    "AttemptLog",
    "AvailableTransition",
    "BulkChangedError",
    "Call",
    "ConditionRegistry",
    "ConfigurationError",
    "Cron",
    "DatabaseEventRegistry",
    "Delivery",
    "Design",
    "Directory",
    "Duly",
    "DulyError",
    "DurableWorkflowEngine",
    "EngineTables",
    "EventError",
    "EventRegistry",
    "EventSettings",
    "Graph",
    "GraphBranch",
    "GraphHistory",
    "GraphInstance",
    "GraphNode",
    "GraphRuntime",
    "GraphSubject",
    "GraphTables",
    "GraphTemplate",
    "GraphTimer",
    "GraphTransition",
    "GraphVisit",
    "GraphVote",
    "Handle",
    "InMemoryEventRegistry",
    "InstanceSnapshot",
    "InternalError",
    "InvalidArgumentError",
    "InvalidWorkflowStateError",
    "Limit",
    "LocalWorkflowEngine",
    "NotADirectiveError",
    "NotAWorkflowError",
    "NotAllowedError",
    "NotConnectedError",
    "NotFoundError",
    "NotInStepError",
    "NotRunningError",
    "PruneResult",
    "RateBucket",
    "Registration",
    "RetentionSettings",
    "RunBusyError",
    "RunFilter",
    "SavedDesign",
    "SelfApprovalError",
    "StateWorkflowError",
    "StaticDirectory",
    "Step",
    "StepError",
    "StrandedRuns",
    "SubmitterNotAllowedError",
    "TemplateInvalidError",
    "TemplateNotActiveError",
    "TransitionOutcome",
    "UnsupportedTypeError",
    "Worker",
    "Workflow",
    "WorkflowAlreadyCompletedError",
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
    "WorkflowSubmissionError",
    "WorkflowTransitionError",
    "activate_template",
    "bridge_connected",
    "child",
    "configure_event_registry",
    "configure_event_registry_from_settings",
    "configure_graph_runtime",
    "configure_workflow_engine",
    "configure_workflow_engine_from_settings",
    "connect_bridge",
    "connect_bridge_from_settings",
    "connect_workflows",
    "count_prunable",
    "declare_engine_tables",
    "disconnect_bridge",
    "every",
    "fan_out",
    "find_workflow",
    "get_event_registry",
    "get_graph_runtime",
    "get_workflow_engine",
    "graph_tables",
    "list_runs",
    "list_templates",
    "load_design",
    "model_change_event",
    "model_created_event",
    "model_deleted_event",
    "model_updated_event",
    "parse_filter",
    "prune",
    "run_workflows",
    "save_design",
    "start_many",
    "step",
    "stranded_runs",
    "validate_graph",
    "wait_for",
    "wait_for_resume",
    "wake",
    "wake_in",
]

# Every public name, by the module that defines it: imported on first use.
_LAZY_MODULES: dict[str, tuple[str, ...]] = {
    "engine.application": ("Duly",),
    "engine.base.cron": ("Cron",),
    "engine.base.errors": (
        "ActionAlreadyRegisteredError",
        "ActionError",
        "ActionExecutionError",
        "ActionNotFoundError",
        "AlreadyVotedError",
        "BulkChangedError",
        "ConfigurationError",
        "DulyError",
        "EventError",
        "InternalError",
        "InvalidArgumentError",
        "InvalidWorkflowStateError",
        "NotADirectiveError",
        "NotAllowedError",
        "NotAWorkflowError",
        "NotConnectedError",
        "NotFoundError",
        "NotInStepError",
        "NotRunningError",
        "RunBusyError",
        "SelfApprovalError",
        "StateWorkflowError",
        "StepError",
        "SubmitterNotAllowedError",
        "TemplateInvalidError",
        "TemplateNotActiveError",
        "UnsupportedTypeError",
        "WorkflowAlreadyCompletedError",
        "WorkflowExecutionError",
        "WorkflowExecutionNotFoundError",
        "WorkflowSubmissionError",
        "WorkflowTransitionError",
    ),
    "engine.claims.stranded": (
        "StrandedRuns",
        "stranded_runs",
    ),
    "engine.events.actions": (
        "Action",
        "ActionRegistry",
    ),
    "engine.events.bridge": (
        "bridge_connected",
        "connect_bridge",
        "connect_bridge_from_settings",
        "disconnect_bridge",
        "model_change_event",
    ),
    "engine.events.configure": (
        "configure_event_registry",
        "configure_event_registry_from_settings",
        "get_event_registry",
    ),
    "engine.events.database": ("DatabaseEventRegistry",),
    "engine.events.event": (
        "WorkflowEvent",
        "model_created_event",
        "model_deleted_event",
        "model_updated_event",
    ),
    "engine.events.outbox": ("WorkflowOutbox",),
    "engine.events.records": (
        "WorkflowDeliveryAttempt",
        "WorkflowEventRecord",
    ),
    "engine.events.routing": (
        "EventRegistry",
        "InMemoryEventRegistry",
        "Registration",
    ),
    "engine.events.settings": ("EventSettings",),
    "engine.executions.configure": (
        "WorkflowEngine",
        "configure_workflow_engine",
        "configure_workflow_engine_from_settings",
        "get_workflow_engine",
    ),
    "engine.executions.durable": (
        "DurableWorkflowEngine",
        "WorkflowExecutionRecord",
    ),
    "engine.executions.local": (
        "LocalWorkflowEngine",
        "wait_for_resume",
    ),
    "engine.executions.state": (
        "WorkflowDefinition",
        "WorkflowExecution",
        "WorkflowState",
    ),
    "engine.graphs.configure": (
        "configure_graph_runtime",
        "get_graph_runtime",
    ),
    "engine.graphs.design.document": ("Design",),
    "engine.graphs.design.model": ("Graph",),
    "engine.graphs.design.validation": ("validate_graph",),
    "engine.graphs.design.versions": (
        "SavedDesign",
        "activate_template",
        "list_templates",
        "load_design",
        "save_design",
    ),
    "engine.graphs.moves.actors": ("Actor",),
    "engine.graphs.moves.conditions": ("ConditionRegistry",),
    "engine.graphs.moves.directory": (
        "Directory",
        "StaticDirectory",
    ),
    "engine.graphs.moves.runtime": ("GraphRuntime",),
    "engine.graphs.moves.snapshots": (
        "AvailableTransition",
        "InstanceSnapshot",
        "TransitionOutcome",
    ),
    "engine.graphs.moves.subjects": ("GraphSubject",),
    "engine.graphs.moves.timers": ("GraphTimer",),
    "engine.graphs.tables": (
        "GraphBranch",
        "GraphHistory",
        "GraphInstance",
        "GraphNode",
        "GraphTables",
        "GraphTemplate",
        "GraphTransition",
        "GraphVisit",
        "GraphVote",
        "graph_tables",
    ),
    "engine.model.attempt_log": ("AttemptLog",),
    "engine.model.connection": ("connect_workflows",),
    "engine.model.limits": (
        "Limit",
        "RateBucket",
    ),
    "engine.model.steps": (
        "Call",
        "Step",
        "step",
    ),
    "engine.retention": (
        "PruneResult",
        "RetentionSettings",
        "count_prunable",
        "prune",
    ),
    "engine.runs.directives": (
        "every",
        "wait_for",
        "wake_in",
    ),
    "engine.runs.fanout": (
        "child",
        "fan_out",
    ),
    "engine.runs.handles": ("Handle",),
    "engine.runs.refusals": ("Delivery",),
    "engine.runs.start": ("start_many",),
    "engine.runs.workflow": ("Workflow",),
    "engine.tables": (
        "EngineTables",
        "declare_engine_tables",
    ),
    "engine.views.filters": (
        "RunFilter",
        "parse_filter",
    ),
    "engine.views.runs": (
        "find_workflow",
        "list_runs",
    ),
    "engine.worker.loop": ("Worker",),
    "engine.worker.running": (
        "run_workflows",
        "wake",
    ),
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}

if TYPE_CHECKING:
    from engine.application import Duly
    from engine.base.cron import Cron
    from engine.base.errors import (
        ActionAlreadyRegisteredError,
        ActionError,
        ActionExecutionError,
        ActionNotFoundError,
        AlreadyVotedError,
        BulkChangedError,
        ConfigurationError,
        DulyError,
        EventError,
        InternalError,
        InvalidArgumentError,
        InvalidWorkflowStateError,
        NotADirectiveError,
        NotAllowedError,
        NotAWorkflowError,
        NotConnectedError,
        NotFoundError,
        NotInStepError,
        NotRunningError,
        RunBusyError,
        SelfApprovalError,
        StateWorkflowError,
        StepError,
        SubmitterNotAllowedError,
        TemplateInvalidError,
        TemplateNotActiveError,
        UnsupportedTypeError,
        WorkflowAlreadyCompletedError,
        WorkflowExecutionError,
        WorkflowExecutionNotFoundError,
        WorkflowSubmissionError,
        WorkflowTransitionError,
    )
    from engine.claims.stranded import StrandedRuns, stranded_runs
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
    from engine.graphs.configure import configure_graph_runtime, get_graph_runtime
    from engine.graphs.design.document import Design
    from engine.graphs.design.model import Graph
    from engine.graphs.design.validation import validate_graph
    from engine.graphs.design.versions import (
        SavedDesign,
        activate_template,
        list_templates,
        load_design,
        save_design,
    )
    from engine.graphs.moves.actors import Actor
    from engine.graphs.moves.conditions import ConditionRegistry
    from engine.graphs.moves.directory import Directory, StaticDirectory
    from engine.graphs.moves.runtime import GraphRuntime
    from engine.graphs.moves.snapshots import (
        AvailableTransition,
        InstanceSnapshot,
        TransitionOutcome,
    )
    from engine.graphs.moves.subjects import GraphSubject
    from engine.graphs.moves.timers import GraphTimer
    from engine.graphs.tables import (
        GraphBranch,
        GraphHistory,
        GraphInstance,
        GraphNode,
        GraphTables,
        GraphTemplate,
        GraphTransition,
        GraphVisit,
        GraphVote,
        graph_tables,
    )
    from engine.model.attempt_log import AttemptLog
    from engine.model.connection import connect_workflows
    from engine.model.limits import Limit, RateBucket
    from engine.model.steps import Call, Step, step
    from engine.retention import PruneResult, RetentionSettings, count_prunable, prune
    from engine.runs.directives import every, wait_for, wake_in
    from engine.runs.fanout import child, fan_out
    from engine.runs.handles import Handle
    from engine.runs.refusals import Delivery
    from engine.runs.start import start_many
    from engine.runs.workflow import Workflow
    from engine.tables import EngineTables, declare_engine_tables
    from engine.views.filters import RunFilter, parse_filter
    from engine.views.runs import find_workflow, list_runs
    from engine.worker.loop import Worker
    from engine.worker.running import run_workflows, wake


def __dir__() -> list[str]:
    """The public names, whether imported yet or not."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    """A public name, imported now and kept (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
