"""The process's workflow engine: which one `get_workflow_engine()` answers.

`configure_workflow_engine(engine)` sets it (None clears it); without one,
`get_workflow_engine()` installs the one `DULY_WORKFLOW_ENGINE` names (read by
`engine.base.resolve`), else by `DULY_MODE` a `DurableWorkflowEngine` in production and a
`LocalWorkflowEngine` otherwise. A value that is no workflow engine is a
`ConfigurationError`. The settings are anything with `workflow_engine` and `production`
(`EventSettings` is one), since the execution engines do not import the event layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from engine.base import settings as variables
from engine.base.resolve import resolve_object
from engine.executions.durable import DurableWorkflowEngine
from engine.executions.local import LocalWorkflowEngine
from engine.executions.state import WorkflowDefinition, WorkflowExecution
from engine.model.application import ambient_application

PRODUCTION = "production"
ENGINE_OPERATIONS = ("start", "status", "resume", "cancel")


class WorkflowEngine(Protocol):
    """What every execution engine does (LocalWorkflowEngine, DurableWorkflowEngine)."""

    async def start(
        self,
        definition: WorkflowDefinition,
        input_data: Mapping[str, Any] | None = None,
        *,
        correlation_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WorkflowExecution: ...

    async def status(self, execution_id: str) -> WorkflowExecution: ...

    async def resume(self, execution_id: str, signal: Any = None) -> WorkflowExecution: ...

    async def cancel(self, execution_id: str, reason: str | None = None) -> WorkflowExecution: ...


class EngineSettings(Protocol):
    """The two settings the choice of engine reads."""

    @property
    def workflow_engine(self) -> str | None: ...

    @property
    def production(self) -> bool: ...


@dataclass(frozen=True)
class WorkflowEngineSettings:
    """DULY_WORKFLOW_ENGINE as written, and whether DULY_MODE says production."""

    workflow_engine: str | None = None
    mode: str = "local"

    @property
    def production(self) -> bool:
        """Whether the mode is production (the durable engine by default)."""
        return self.mode == PRODUCTION

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkflowEngineSettings:
        """Read the two variables (os.environ unless given), as EventSettings reads them."""
        return cls(
            workflow_engine=variables.WORKFLOW_ENGINE.read(environ),
            mode=variables.MODE.read(environ),
        )


def get_workflow_engine() -> WorkflowEngine:
    """The current application's engine; without one, the settings' engine, installed on it
    for later calls."""
    app = ambient_application()
    engine: WorkflowEngine | None = app.workflow_engine
    if engine is None:
        settings = WorkflowEngineSettings.from_env()
        engine = app.workflow_engine = resolve_workflow_engine(settings.workflow_engine, settings)
    return engine


def configure_workflow_engine(engine: WorkflowEngine | None) -> None:
    """Make `engine` the current application's engine; None clears it (the settings choose
    again).

    The engine is trusted to be one (the type hint is not checked at runtime).
    """
    ambient_application().workflow_engine = engine


def configure_workflow_engine_from_settings(
    settings: EngineSettings | None = None,
) -> WorkflowEngine:
    """Choose the engine from DULY_WORKFLOW_ENGINE, or by DULY_MODE when it is unset."""
    chosen: EngineSettings = settings if settings is not None else WorkflowEngineSettings.from_env()
    engine = resolve_workflow_engine(chosen.workflow_engine, chosen)
    configure_workflow_engine(engine)
    return engine


def resolve_workflow_engine(value: Any, settings: EngineSettings) -> WorkflowEngine:
    """The engine `value` names; None means the mode's default."""
    if value is None:
        if settings.production:
            return DurableWorkflowEngine()
        return LocalWorkflowEngine()
    engine: WorkflowEngine = resolve_object(
        value, accepts=is_workflow_engine, what="workflow engine"
    )
    return engine


def is_workflow_engine(value: Any) -> bool:
    """Whether `value` is an engine instance: it can start, status, resume and cancel."""
    if isinstance(value, type):
        return False
    return all(callable(getattr(value, name, None)) for name in ENGINE_OPERATIONS)
