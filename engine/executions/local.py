"""`LocalWorkflowEngine`: executions kept in this process's memory, for development and tests.

Everything crossing the engine's boundary is deep-copied (input, metadata,
what the handler is given, resume signals), so a returned snapshot never
changes under its caller, nor the engine's state under a caller's later
mutation. A handler that raises leaves a failed execution; nothing
propagates. A handler that returns `wait_for_resume()` parks its execution as waiting;
`resume(id, signal)` records the signal under `metadata["resume_signal"]`
and runs the handler again with the signal in its input.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from engine.base.errors import WorkflowExecutionNotFoundError
from engine.executions.state import (
    ACTIVE_STATES,
    WorkflowDefinition,
    WorkflowExecution,
    WorkflowState,
    require_state,
)


class WaitForResume:
    """What a handler returns to wait for `resume()`: see `wait_for_resume()`."""

    def __repr__(self) -> str:
        return "wait_for_resume()"


_WAITING: Final = WaitForResume()


def wait_for_resume() -> WaitForResume:
    """Return this from a definition's handler to park the execution until `resume()`."""
    return _WAITING


RESUME_SIGNAL = "resume_signal"  # where a resume's signal is kept, in metadata and input


class LocalWorkflowEngine:
    """Runs workflow definitions in process; executions live as long as the engine."""

    def __init__(self) -> None:
        self._executions: dict[str, WorkflowExecution] = {}
        self._definitions: dict[str, WorkflowDefinition] = {}  # by execution id
        self.registered: dict[str, WorkflowDefinition] = {}  # by workflow id
        self._by_correlation: dict[tuple[str, str], str] = {}
        self._starting: dict[tuple[str, str], asyncio.Future[WorkflowExecution]] = {}

    async def start(
        self,
        definition: WorkflowDefinition,
        input_data: Mapping[str, Any] | None = None,
        *,
        correlation_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WorkflowExecution:
        """Run `definition` on `input_data`; the execution as it stands when the handler returned.

        A non-empty `correlation_id` seen before for this workflow returns
        that execution (whatever its state, failed included) and ignores
        the new input; a start already under way with it is waited for.
        """
        if not correlation_id:
            return await self._run_new(definition, input_data, None, metadata)
        key = (definition.workflow_id, correlation_id)
        # A start under way is waited for first: its execution exists, but is still running.
        in_flight = self._starting.get(key)
        if in_flight is not None:
            await asyncio.shield(in_flight)
            return self._snapshot(self._by_correlation[key])
        existing = self._by_correlation.get(key)
        if existing is not None:
            return self._snapshot(existing)
        done: asyncio.Future[WorkflowExecution] = asyncio.get_running_loop().create_future()
        self._starting[key] = done
        try:
            execution = await self._run_new(definition, input_data, correlation_id, metadata)
            done.set_result(execution)
            return execution
        except BaseException as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: a start nobody waits for is not an unhandled error
            raise
        finally:
            del self._starting[key]

    def register(self, definition: WorkflowDefinition) -> WorkflowDefinition:
        """Accepted for symmetry with `DurableWorkflowEngine.register` (whose workers need it).

        A local engine runs the definition `start` is given, so there is nothing to find.
        """
        self.registered[definition.workflow_id] = definition
        return definition

    async def status(self, execution_id: str) -> WorkflowExecution:
        """The execution as it stands."""
        return self._snapshot(execution_id)

    async def resume(self, execution_id: str, signal: Any = None) -> WorkflowExecution:
        """Wake a waiting execution: the signal is recorded, and its handler runs again."""
        execution = self._get(execution_id)
        require_state(execution, "resume", (WorkflowState.WAITING,))
        metadata = dict(execution.metadata)
        if signal is not None:
            metadata[RESUME_SIGNAL] = copy.deepcopy(signal)
        execution = self._save(replace(execution, state=WorkflowState.RUNNING, metadata=metadata))
        given = dict(copy.deepcopy(execution.input_data))
        if signal is not None:
            given[RESUME_SIGNAL] = copy.deepcopy(signal)
        await self._run_handler(execution, given)
        return self._snapshot(execution_id)

    async def cancel(self, execution_id: str, reason: str | None = None) -> WorkflowExecution:
        """End an active execution; its `error` says why."""
        execution = self._get(execution_id)
        require_state(execution, "cancel", ACTIVE_STATES)
        now = _now()
        self._save(
            replace(
                execution,
                state=WorkflowState.CANCELLED,
                error=reason,
                updated_at=now,
                finished_at=now,
            )
        )
        return self._snapshot(execution_id)

    async def _run_new(
        self,
        definition: WorkflowDefinition,
        input_data: Mapping[str, Any] | None,
        correlation_id: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> WorkflowExecution:
        now = _now()
        execution = WorkflowExecution(
            execution_id=str(uuid.uuid4()),
            workflow_id=definition.workflow_id,
            state=WorkflowState.RUNNING,
            input_data=copy.deepcopy(dict(input_data or {})),
            correlation_id=correlation_id,
            started_at=now,
            updated_at=now,
            metadata=copy.deepcopy(dict(metadata or {})),
        )
        self._definitions[execution.execution_id] = definition
        self._save(execution)
        if correlation_id:
            self._by_correlation[(definition.workflow_id, correlation_id)] = execution.execution_id
        await self._run_handler(execution, copy.deepcopy(dict(execution.input_data)))
        return self._snapshot(execution.execution_id)

    async def _run_handler(self, execution: WorkflowExecution, given: dict[str, Any]) -> None:
        handler = self._definitions[execution.execution_id].handler
        try:
            result: object = None if handler is None else handler(given)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            self._finish(execution.execution_id, WorkflowState.FAILED, error=f"{exc}")
            return
        if isinstance(result, WaitForResume):
            current = self._get(execution.execution_id)
            if current.state == WorkflowState.RUNNING:
                self._save(replace(current, state=WorkflowState.WAITING, updated_at=_now()))
            return
        output = result if isinstance(result, Mapping) else None
        self._finish(execution.execution_id, WorkflowState.COMPLETED, output=output)

    def _finish(
        self,
        execution_id: str,
        state: WorkflowState,
        *,
        output: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        current = self._get(execution_id)
        if current.state != WorkflowState.RUNNING:
            return  # cancelled while its handler ran: the cancel stands
        now = _now()
        self._save(
            replace(
                current,
                state=state,
                output_data=copy.deepcopy(dict(output or {})),
                error=error,
                updated_at=now,
                finished_at=now,
            )
        )

    def _get(self, execution_id: str) -> WorkflowExecution:
        try:
            return self._executions[execution_id]
        except KeyError:
            raise WorkflowExecutionNotFoundError(
                f"No workflow execution has the id {execution_id!r}.", execution_id=execution_id
            ) from None

    def _save(self, execution: WorkflowExecution) -> WorkflowExecution:
        self._executions[execution.execution_id] = execution
        return execution

    def _snapshot(self, execution_id: str) -> WorkflowExecution:
        """A deep copy: what the caller holds never changes with the engine's state."""
        return copy.deepcopy(self._get(execution_id))


def _now() -> datetime:
    return datetime.now(UTC)
