"""Where each of `engine`'s public names lives, imported by `engine` only when first asked for.

The table is data, not imports: importing this module loads no other
(the imports below are for type checkers only), so `import engine` stays
cheap and each name brings only its own module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Each module, and the public names it defines (space-separated).
LAZY_MODULES: dict[str, str] = {
    "engine.application": "Duly",
    "engine.base.audit": "AuditEntry MAX_ACTIONS_READ recent_actions record_action",
    "engine.base.clock": "clock_shift db_now",
    "engine.base.cron": "Cron",
    "engine.base.errors": (
        "ActionAlreadyRegisteredError ActionError ActionExecutionError ActionNotFoundError "
        "AlreadyVotedError BulkChangedError ConfigurationError DulyError EventError first_line "
        "InternalError InvalidArgumentError InvalidWorkflowStateError NotADirectiveError "
        "NotAllowedError NotAWorkflowError NotConnectedError NotFoundError NotInStepError "
        "NotRunningError RunBusyError SelfApprovalError StateWorkflowError StepError "
        "StepFailed StepTimeoutError SubmitterNotAllowedError TemplateInvalidError "
        "TemplateNotActiveError UnsupportedTypeError WaitTimeoutError "
        "WorkflowAlreadyCompletedError WorkflowExecutionError WorkflowExecutionNotFoundError "
        "WorkflowSubmissionError WorkflowTransitionError"
    ),
    "engine.base.key_strength": "key_refusal",
    "engine.base.owned_tables": "declare_owned_tables OWNED_TABLES",
    "engine.base.seen_signatures": "record_signature",
    "engine.base.sessions": "console_sessions",
    "engine.base.shown": "json_value SHOWN_NESTING",
    "engine.bulk": (
        "apply_replay apply_runs AuditActor BulkCancel BulkProgress BulkRun DeadLetterFilter "
        "plan_replay plan_runs resume_replay resume_runs RunAction start_replay start_runs"
    ),
    "engine.bulk.single": "cancel_recorded replay_recorded run_recorded start_recorded",
    "engine.claims.next_due": "next_due",
    "engine.claims.stranded": "stranded_runs StrandedRuns",
    "engine.events.actions": "Action ActionRegistry",
    "engine.events.bridge": (
        "bridge_connected connect_bridge connect_bridge_from_settings disconnect_bridge "
        "model_change_event"
    ),
    "engine.events.configure": (
        "configure_event_registry configure_event_registry_from_settings get_event_registry "
        "routing_of"
    ),
    "engine.events.database": "DatabaseEventRegistry event_values",
    "engine.events.event": (
        "model_created_event model_deleted_event model_updated_event WorkflowEvent"
    ),
    "engine.events.outbox": "WorkflowOutbox",
    "engine.events.records": (
        "EventTables outbox_classes_on outbox_tables_of OutboxColumns tables_for "
        "WorkflowDeliveryAttempt WorkflowEventRecord"
    ),
    "engine.events.routing": "EventRegistry InMemoryEventRegistry Registration Routes",
    "engine.events.settings": "EventSettings",
    "engine.events.statuses": "DEAD_LETTER",
    "engine.events.views": (
        "drain_progress DrainProgress due_event_ids event_detail list_outbox MAX_OUTBOX_OFFSET "
        "outbox_summary VIEW_STATUSES"
    ),
    "engine.executions.configure": (
        "configure_workflow_engine configure_workflow_engine_from_settings get_workflow_engine "
        "WorkflowEngine"
    ),
    "engine.executions.durable": "DurableWorkflowEngine WorkflowExecutionRecord",
    "engine.executions.local": "LocalWorkflowEngine wait_for_resume",
    "engine.executions.state": "WorkflowDefinition WorkflowExecution WorkflowState",
    "engine.graphs.configure": "configure_graph_runtime get_graph_runtime",
    "engine.graphs.design.document": "describe_design_error Design design_matches drawn_design",
    "engine.graphs.design.model": "Graph load_graph Node",
    "engine.graphs.design.problems": "Problem",
    "engine.graphs.design.validation": "validate_graph",
    "engine.graphs.design.versions": (
        "activate_template active_template_id list_templates load_design save_design SavedDesign"
    ),
    "engine.graphs.moves.actors": "Actor",
    "engine.graphs.moves.conditions": "ConditionRegistry",
    "engine.graphs.moves.directory": "admitted Directory effective_assignees StaticDirectory",
    "engine.graphs.moves.history": "HistoryEntry",
    "engine.graphs.moves.notifications": "STATE_ASSIGNMENT STATE_COMPLETION",
    "engine.graphs.moves.runtime": "GraphRuntime",
    "engine.graphs.moves.snapshots": (
        "AvailableTransition BranchSnapshot InstanceSnapshot TransitionOutcome"
    ),
    "engine.graphs.moves.subjects": "GraphSubject key_values subject_class subject_types",
    "engine.graphs.moves.timers": "GraphTimer",
    "engine.graphs.moves.votes": (
        "CastVotes counted_voters counts_votes current_votes required_approvals"
    ),
    "engine.graphs.tables": (
        "ANY_SUBMITTER ASSIGNMENT CONDITION graph_tables GraphBranch GraphHistory GraphInstance "
        "GraphNode GraphTables GraphTemplate GraphTransition GraphVisit GraphVote STATUS_CHANGE "
        "SUBMITTERS"
    ),
    "engine.model.application": "Application current_application",
    "engine.model.attempt_log": "attempt_log_classes AttemptLog",
    "engine.model.effects": "step_session",
    "engine.model.connection": (
        "application_for connect_workflows open_connection WorkflowConnection"
    ),
    "engine.model.limits": "Limit RateBucket",
    "engine.model.registry": "ENGINE_COLUMNS registered_workflows WorkflowInfo",
    "engine.model.steps": "Call step Step",
    "engine.model.telemetry": "current_run latest_metrics",
    "engine.partitions": "ensure_partitions_sql partition_attempt_log unpartition_attempt_log",
    "engine.retention": "Batch count_prunable prune PruneResult RetentionSettings",
    "engine.runs.directives": "every wait_for wake_in",
    "engine.runs.fanout": "child fan_out",
    "engine.runs.handles": "Handle",
    "engine.runs.keys": "RunKey",
    "engine.runs.refusals": "Delivery MOVED_MEANWHILE REFUSAL_REASONS",
    "engine.runs.schedules": "SCHEDULE_ACTIONS ScheduleAction steer_schedule Steered",
    "engine.runs.start": "start_many",
    "engine.runs.waiting": "wait_for_end",
    "engine.runs.workflow": "Workflow",
    "engine.tables": "declare_engine_tables EngineTables",
    "engine.views.activity": "activity",
    "engine.views.filters": (
        "filterable_columns key_of MAX_FILTER_TEXT parse_filter parse_key RunFilter time_columns"
    ),
    "engine.views.overview": "open_outbox overview RUN_STATES WorkflowCounts",
    "engine.views.run": "database_now run_detail RunDetail",
    "engine.views.runs": (
        "DEFAULT_PAGE find_workflow key_text list_runs RUN_ORDERS RunPage SCAN_WINDOW"
    ),
    "engine.views.schedules": "list_schedules ScheduledRun",
    "engine.worker.loop": "Worker",
    "engine.worker.options": "WorkerOptions",
    "engine.worker.running": "run_workflows wake",
}
# Public namespaces: modules whose names are their API.
SUBMODULES = {
    "settings": "engine.base.settings",  # every `DULY_*` variable: its default, check and meaning
    "telemetry": "engine.model.telemetry",  # the engine's metrics and the emitters that listen
}
LAZY = {name: module for module, names in LAZY_MODULES.items() for name in names.split()}

if TYPE_CHECKING:
    from engine.application import Duly as Duly
    from engine.base import settings as settings
    from engine.base.audit import (
        MAX_ACTIONS_READ as MAX_ACTIONS_READ,
        AuditEntry as AuditEntry,
        recent_actions as recent_actions,
        record_action as record_action,
    )
    from engine.base.clock import clock_shift as clock_shift, db_now as db_now
    from engine.base.cron import Cron as Cron
    from engine.base.errors import (
        ActionAlreadyRegisteredError as ActionAlreadyRegisteredError,
        ActionError as ActionError,
        ActionExecutionError as ActionExecutionError,
        ActionNotFoundError as ActionNotFoundError,
        AlreadyVotedError as AlreadyVotedError,
        BulkChangedError as BulkChangedError,
        ConfigurationError as ConfigurationError,
        DulyError as DulyError,
        EventError as EventError,
        InternalError as InternalError,
        InvalidArgumentError as InvalidArgumentError,
        InvalidWorkflowStateError as InvalidWorkflowStateError,
        NotADirectiveError as NotADirectiveError,
        NotAllowedError as NotAllowedError,
        NotAWorkflowError as NotAWorkflowError,
        NotConnectedError as NotConnectedError,
        NotFoundError as NotFoundError,
        NotInStepError as NotInStepError,
        NotRunningError as NotRunningError,
        RunBusyError as RunBusyError,
        SelfApprovalError as SelfApprovalError,
        StateWorkflowError as StateWorkflowError,
        StepError as StepError,
        StepFailed as StepFailed,
        StepTimeoutError as StepTimeoutError,
        SubmitterNotAllowedError as SubmitterNotAllowedError,
        TemplateInvalidError as TemplateInvalidError,
        TemplateNotActiveError as TemplateNotActiveError,
        UnsupportedTypeError as UnsupportedTypeError,
        WaitTimeoutError as WaitTimeoutError,
        WorkflowAlreadyCompletedError as WorkflowAlreadyCompletedError,
        WorkflowExecutionError as WorkflowExecutionError,
        WorkflowExecutionNotFoundError as WorkflowExecutionNotFoundError,
        WorkflowSubmissionError as WorkflowSubmissionError,
        WorkflowTransitionError as WorkflowTransitionError,
        first_line as first_line,
    )
    from engine.base.key_strength import key_refusal as key_refusal
    from engine.base.owned_tables import (
        OWNED_TABLES as OWNED_TABLES,
        declare_owned_tables as declare_owned_tables,
    )
    from engine.base.seen_signatures import record_signature as record_signature
    from engine.base.sessions import console_sessions as console_sessions
    from engine.base.shown import SHOWN_NESTING as SHOWN_NESTING, json_value as json_value
    from engine.bulk import (
        AuditActor as AuditActor,
        BulkCancel as BulkCancel,
        BulkProgress as BulkProgress,
        BulkRun as BulkRun,
        DeadLetterFilter as DeadLetterFilter,
        RunAction as RunAction,
        apply_replay as apply_replay,
        apply_runs as apply_runs,
        plan_replay as plan_replay,
        plan_runs as plan_runs,
        resume_replay as resume_replay,
        resume_runs as resume_runs,
        start_replay as start_replay,
        start_runs as start_runs,
    )
    from engine.bulk.single import (
        cancel_recorded as cancel_recorded,
        replay_recorded as replay_recorded,
        run_recorded as run_recorded,
        start_recorded as start_recorded,
    )
    from engine.claims.next_due import next_due as next_due
    from engine.claims.stranded import StrandedRuns as StrandedRuns, stranded_runs as stranded_runs
    from engine.events.actions import Action as Action, ActionRegistry as ActionRegistry
    from engine.events.bridge import (
        bridge_connected as bridge_connected,
        connect_bridge as connect_bridge,
        connect_bridge_from_settings as connect_bridge_from_settings,
        disconnect_bridge as disconnect_bridge,
        model_change_event as model_change_event,
    )
    from engine.events.configure import (
        configure_event_registry as configure_event_registry,
        configure_event_registry_from_settings as configure_event_registry_from_settings,
        get_event_registry as get_event_registry,
        routing_of as routing_of,
    )
    from engine.events.database import (
        DatabaseEventRegistry as DatabaseEventRegistry,
        event_values as event_values,
    )
    from engine.events.event import (
        WorkflowEvent as WorkflowEvent,
        model_created_event as model_created_event,
        model_deleted_event as model_deleted_event,
        model_updated_event as model_updated_event,
    )
    from engine.events.outbox import WorkflowOutbox as WorkflowOutbox
    from engine.events.records import (
        EventTables as EventTables,
        OutboxColumns as OutboxColumns,
        WorkflowDeliveryAttempt as WorkflowDeliveryAttempt,
        WorkflowEventRecord as WorkflowEventRecord,
        outbox_classes_on as outbox_classes_on,
        outbox_tables_of as outbox_tables_of,
        tables_for as tables_for,
    )
    from engine.events.routing import (
        EventRegistry as EventRegistry,
        InMemoryEventRegistry as InMemoryEventRegistry,
        Registration as Registration,
        Routes as Routes,
    )
    from engine.events.settings import EventSettings as EventSettings
    from engine.events.statuses import DEAD_LETTER as DEAD_LETTER
    from engine.events.views import (
        MAX_OUTBOX_OFFSET as MAX_OUTBOX_OFFSET,
        VIEW_STATUSES as VIEW_STATUSES,
        DrainProgress as DrainProgress,
        drain_progress as drain_progress,
        due_event_ids as due_event_ids,
        event_detail as event_detail,
        list_outbox as list_outbox,
        outbox_summary as outbox_summary,
    )
    from engine.executions.configure import (
        WorkflowEngine as WorkflowEngine,
        configure_workflow_engine as configure_workflow_engine,
        configure_workflow_engine_from_settings as configure_workflow_engine_from_settings,
        get_workflow_engine as get_workflow_engine,
    )
    from engine.executions.durable import (
        DurableWorkflowEngine as DurableWorkflowEngine,
        WorkflowExecutionRecord as WorkflowExecutionRecord,
    )
    from engine.executions.local import (
        LocalWorkflowEngine as LocalWorkflowEngine,
        wait_for_resume as wait_for_resume,
    )
    from engine.executions.state import (
        WorkflowDefinition as WorkflowDefinition,
        WorkflowExecution as WorkflowExecution,
        WorkflowState as WorkflowState,
    )
    from engine.graphs.configure import (
        configure_graph_runtime as configure_graph_runtime,
        get_graph_runtime as get_graph_runtime,
    )
    from engine.graphs.design.document import (
        Design as Design,
        describe_design_error as describe_design_error,
        design_matches as design_matches,
        drawn_design as drawn_design,
    )
    from engine.graphs.design.model import Graph as Graph, Node as Node, load_graph as load_graph
    from engine.graphs.design.problems import Problem as Problem
    from engine.graphs.design.validation import validate_graph as validate_graph
    from engine.graphs.design.versions import (
        SavedDesign as SavedDesign,
        activate_template as activate_template,
        active_template_id as active_template_id,
        list_templates as list_templates,
        load_design as load_design,
        save_design as save_design,
    )
    from engine.graphs.moves.actors import Actor as Actor
    from engine.graphs.moves.conditions import ConditionRegistry as ConditionRegistry
    from engine.graphs.moves.directory import (
        Directory as Directory,
        StaticDirectory as StaticDirectory,
        admitted as admitted,
        effective_assignees as effective_assignees,
    )
    from engine.graphs.moves.history import HistoryEntry as HistoryEntry
    from engine.graphs.moves.notifications import (
        STATE_ASSIGNMENT as STATE_ASSIGNMENT,
        STATE_COMPLETION as STATE_COMPLETION,
    )
    from engine.graphs.moves.runtime import GraphRuntime as GraphRuntime
    from engine.graphs.moves.snapshots import (
        AvailableTransition as AvailableTransition,
        BranchSnapshot as BranchSnapshot,
        InstanceSnapshot as InstanceSnapshot,
        TransitionOutcome as TransitionOutcome,
    )
    from engine.graphs.moves.subjects import (
        GraphSubject as GraphSubject,
        key_values as key_values,
        subject_class as subject_class,
        subject_types as subject_types,
    )
    from engine.graphs.moves.timers import GraphTimer as GraphTimer
    from engine.graphs.moves.votes import (
        CastVotes as CastVotes,
        counted_voters as counted_voters,
        counts_votes as counts_votes,
        current_votes as current_votes,
        required_approvals as required_approvals,
    )
    from engine.graphs.tables import (
        ANY_SUBMITTER as ANY_SUBMITTER,
        ASSIGNMENT as ASSIGNMENT,
        CONDITION as CONDITION,
        STATUS_CHANGE as STATUS_CHANGE,
        SUBMITTERS as SUBMITTERS,
        GraphBranch as GraphBranch,
        GraphHistory as GraphHistory,
        GraphInstance as GraphInstance,
        GraphNode as GraphNode,
        GraphTables as GraphTables,
        GraphTemplate as GraphTemplate,
        GraphTransition as GraphTransition,
        GraphVisit as GraphVisit,
        GraphVote as GraphVote,
        graph_tables as graph_tables,
    )
    from engine.model import telemetry as telemetry
    from engine.model.application import (
        Application as Application,
        current_application as current_application,
    )
    from engine.model.attempt_log import (
        AttemptLog as AttemptLog,
        attempt_log_classes as attempt_log_classes,
    )
    from engine.model.connection import (
        WorkflowConnection as WorkflowConnection,
        application_for as application_for,
        connect_workflows as connect_workflows,
        open_connection as open_connection,
    )
    from engine.model.effects import step_session as step_session
    from engine.model.limits import Limit as Limit, RateBucket as RateBucket
    from engine.model.registry import (
        ENGINE_COLUMNS as ENGINE_COLUMNS,
        WorkflowInfo as WorkflowInfo,
        registered_workflows as registered_workflows,
    )
    from engine.model.steps import Call as Call, Step as Step, step as step
    from engine.model.telemetry import current_run as current_run, latest_metrics as latest_metrics
    from engine.partitions import (
        ensure_partitions_sql as ensure_partitions_sql,
        partition_attempt_log as partition_attempt_log,
        unpartition_attempt_log as unpartition_attempt_log,
    )
    from engine.retention import (
        Batch as Batch,
        PruneResult as PruneResult,
        RetentionSettings as RetentionSettings,
        count_prunable as count_prunable,
        prune as prune,
    )
    from engine.runs.directives import every as every, wait_for as wait_for, wake_in as wake_in
    from engine.runs.fanout import child as child, fan_out as fan_out
    from engine.runs.handles import Handle as Handle
    from engine.runs.keys import RunKey as RunKey
    from engine.runs.refusals import (
        MOVED_MEANWHILE as MOVED_MEANWHILE,
        REFUSAL_REASONS as REFUSAL_REASONS,
        Delivery as Delivery,
    )
    from engine.runs.schedules import (
        SCHEDULE_ACTIONS as SCHEDULE_ACTIONS,
        ScheduleAction as ScheduleAction,
        Steered as Steered,
        steer_schedule as steer_schedule,
    )
    from engine.runs.start import start_many as start_many
    from engine.runs.waiting import wait_for_end as wait_for_end
    from engine.runs.workflow import Workflow as Workflow
    from engine.tables import (
        EngineTables as EngineTables,
        declare_engine_tables as declare_engine_tables,
    )
    from engine.views.activity import activity as activity
    from engine.views.filters import (
        MAX_FILTER_TEXT as MAX_FILTER_TEXT,
        RunFilter as RunFilter,
        filterable_columns as filterable_columns,
        key_of as key_of,
        parse_filter as parse_filter,
        parse_key as parse_key,
        time_columns as time_columns,
    )
    from engine.views.overview import (
        RUN_STATES as RUN_STATES,
        WorkflowCounts as WorkflowCounts,
        open_outbox as open_outbox,
        overview as overview,
    )
    from engine.views.run import (
        RunDetail as RunDetail,
        database_now as database_now,
        run_detail as run_detail,
    )
    from engine.views.runs import (
        DEFAULT_PAGE as DEFAULT_PAGE,
        RUN_ORDERS as RUN_ORDERS,
        SCAN_WINDOW as SCAN_WINDOW,
        RunPage as RunPage,
        find_workflow as find_workflow,
        key_text as key_text,
        list_runs as list_runs,
    )
    from engine.views.schedules import (
        ScheduledRun as ScheduledRun,
        list_schedules as list_schedules,
    )
    from engine.worker.loop import Worker as Worker
    from engine.worker.options import WorkerOptions as WorkerOptions
    from engine.worker.running import run_workflows as run_workflows, wake as wake
