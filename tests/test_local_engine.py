"""The execution state model and `LocalWorkflowEngine`, rule by rule (seed 000, "Execution
state" and "Backends").

- pending, running, waiting are active; completed, failed, cancelled terminal:
  test_active_and_terminal_states
- resume only when waiting, cancel only when active; the error names the
  execution, the operation, the current state and the expected ones, comma-joined:
  test_resume_is_valid_only_for_waiting_executions,
  test_cancel_is_valid_only_for_active_executions
- WorkflowDefinition and WorkflowExecution are frozen; mappings stored as given,
  not copied; version defaults to "1": test_records_are_frozen_and_keep_mappings_as_given
- the local engine deep-copies input, metadata, handler input and resume
  signals: test_the_engine_copies_what_crosses_its_boundary
- a workflow without a handler completes at once with empty output:
  test_a_definition_without_handler_completes_with_empty_output
- handler exceptions become failed executions, not exceptions:
  test_a_failing_handler_leaves_a_failed_execution
- a non-empty correlation id reuses the execution of the same workflow (failed
  included) and ignores new input; empty or missing ones make new executions:
  test_a_correlation_id_reuses_the_execution_even_a_failed_one,
  test_empty_or_missing_correlation_ids_start_independent_executions
- concurrent starts with one correlation key wait for the one in flight:
  test_concurrent_starts_with_one_key_share_one_execution
- resume records the signal under metadata["resume_signal"]; cancel stores its
  reason in error: test_resume_records_the_signal_and_runs_the_handler_again,
  test_cancel_stores_its_reason
- status, resume and cancel of an unknown id: WorkflowExecutionNotFoundError:
  test_unknown_ids_are_not_found
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from engine import (
    InvalidWorkflowStateError,
    LocalWorkflowEngine,
    NotFoundError,
    WorkflowDefinition,
    WorkflowExecution,
    WorkflowExecutionNotFoundError,
    WorkflowState,
    wait_for_resume,
)
from engine.executions.state import ACTIVE_STATES, TERMINAL_STATES


def waiting_definition(seen: list[Mapping[str, Any]]) -> WorkflowDefinition:
    def handler(given: Mapping[str, Any]) -> object:
        seen.append(given)
        if "resume_signal" not in given:
            return wait_for_resume()
        return {"approved_by": given["resume_signal"]["by"]}

    return WorkflowDefinition("approval", handler)


def test_active_and_terminal_states() -> None:
    assert {s.value for s in ACTIVE_STATES} == {"pending", "running", "waiting"}
    assert {s.value for s in TERMINAL_STATES} == {"completed", "failed", "cancelled"}
    assert set(ACTIVE_STATES) | set(TERMINAL_STATES) == set(WorkflowState)


def test_records_are_frozen_and_keep_mappings_as_given() -> None:
    payload = {"nested": {"a": 1}}
    definition = WorkflowDefinition("w")
    execution = WorkflowExecution("e1", "w", WorkflowState.PENDING, input_data=payload)
    assert definition.version == "1"
    assert execution.input_data is payload
    with pytest.raises(dataclasses.FrozenInstanceError):
        execution.state = WorkflowState.RUNNING  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        definition.workflow_id = "other"  # type: ignore[misc]


async def test_a_definition_without_handler_completes_with_empty_output() -> None:
    execution = await LocalWorkflowEngine().start(WorkflowDefinition("noop"), {"x": 1})
    assert execution.state == WorkflowState.COMPLETED
    assert execution.output_data == {}
    assert execution.finished_at is not None


async def test_a_failing_handler_leaves_a_failed_execution() -> None:
    def handler(given: Mapping[str, Any]) -> None:
        raise RuntimeError("card declined")

    execution = await LocalWorkflowEngine().start(WorkflowDefinition("pay", handler))
    assert (execution.state, execution.error) == (WorkflowState.FAILED, "card declined")


async def test_async_handlers_return_their_output() -> None:
    async def handler(given: Mapping[str, Any]) -> Mapping[str, Any]:
        await asyncio.sleep(0)
        return {"double": given["n"] * 2}

    execution = await LocalWorkflowEngine().start(WorkflowDefinition("d", handler), {"n": 21})
    assert execution.output_data == {"double": 42}


async def test_the_engine_copies_what_crosses_its_boundary() -> None:
    seen: list[Mapping[str, Any]] = []
    local = LocalWorkflowEngine()
    data = {"items": [1, 2]}
    metadata = {"tags": ["a"]}
    execution = await local.start(waiting_definition(seen), data, metadata=metadata)
    data["items"].append(3)
    metadata["tags"].append("b")
    seen[0]["items"].append(99)  # the handler's input is its own copy too
    stored = await local.status(execution.execution_id)
    assert stored.input_data == {"items": [1, 2]}
    assert stored.metadata == {"tags": ["a"]}
    execution.metadata["tags"].append("c")  # a snapshot is the caller's own
    assert (await local.status(execution.execution_id)).metadata == {"tags": ["a"]}
    signal = {"by": "ann"}
    await local.resume(execution.execution_id, signal)
    signal["by"] = "bob"
    assert (await local.status(execution.execution_id)).metadata["resume_signal"] == {"by": "ann"}


async def test_a_correlation_id_reuses_the_execution_even_a_failed_one() -> None:
    calls = []

    def handler(given: Mapping[str, Any]) -> None:
        calls.append(given)
        raise ValueError("no")

    local = LocalWorkflowEngine()
    definition = WorkflowDefinition("import", handler)
    first = await local.start(definition, {"file": "a"}, correlation_id="evt-1")
    again = await local.start(definition, {"file": "b"}, correlation_id="evt-1")
    assert first.state == WorkflowState.FAILED
    assert again.execution_id == first.execution_id
    assert again.input_data == {"file": "a"}  # the new input is ignored
    assert len(calls) == 1
    other = await local.start(WorkflowDefinition("other"), correlation_id="evt-1")
    assert other.execution_id != first.execution_id  # the key is per workflow


async def test_empty_or_missing_correlation_ids_start_independent_executions() -> None:
    local = LocalWorkflowEngine()
    definition = WorkflowDefinition("w")
    ids = {
        (await local.start(definition, correlation_id=key)).execution_id
        for key in (None, None, "", "")
    }
    assert len(ids) == 4


async def test_concurrent_starts_with_one_key_share_one_execution() -> None:
    release = asyncio.Event()
    runs = 0

    async def handler(given: Mapping[str, Any]) -> Mapping[str, Any]:
        nonlocal runs
        runs += 1
        await release.wait()
        return {"done": True}

    local = LocalWorkflowEngine()
    definition = WorkflowDefinition("slow", handler)
    starts = [asyncio.create_task(local.start(definition, correlation_id="k")) for _ in range(5)]
    await asyncio.sleep(0.01)
    release.set()
    executions = await asyncio.gather(*starts)
    assert runs == 1
    assert {e.execution_id for e in executions} == {executions[0].execution_id}
    assert {e.state for e in executions} == {WorkflowState.COMPLETED}


async def test_resume_records_the_signal_and_runs_the_handler_again() -> None:
    seen: list[Mapping[str, Any]] = []
    local = LocalWorkflowEngine()
    execution = await local.start(waiting_definition(seen), {"amount": 10})
    assert execution.state == WorkflowState.WAITING
    resumed = await local.resume(execution.execution_id, {"by": "ann"})
    assert resumed.state == WorkflowState.COMPLETED
    assert resumed.metadata["resume_signal"] == {"by": "ann"}
    assert resumed.output_data == {"approved_by": "ann"}
    assert seen[1] == {"amount": 10, "resume_signal": {"by": "ann"}}


async def test_resume_is_valid_only_for_waiting_executions() -> None:
    local = LocalWorkflowEngine()
    done = await local.start(WorkflowDefinition("w"))
    with pytest.raises(InvalidWorkflowStateError) as refused:
        await local.resume(done.execution_id, {"x": 1})
    error = refused.value
    assert (error.execution_id, error.operation, error.state) == (
        done.execution_id,
        "resume",
        "completed",
    )
    assert error.expected == ("waiting",)
    assert done.execution_id in str(error) and "completed" in str(error)


async def test_cancel_is_valid_only_for_active_executions() -> None:
    local = LocalWorkflowEngine()
    done = await local.start(WorkflowDefinition("w"))
    with pytest.raises(InvalidWorkflowStateError, match="pending, running, waiting"):
        await local.cancel(done.execution_id)


async def test_cancel_stores_its_reason() -> None:
    local = LocalWorkflowEngine()
    execution = await local.start(waiting_definition([]))
    cancelled = await local.cancel(execution.execution_id, reason="withdrawn")
    assert (cancelled.state, cancelled.error) == (WorkflowState.CANCELLED, "withdrawn")
    with pytest.raises(InvalidWorkflowStateError):
        await local.resume(execution.execution_id)


async def test_unknown_ids_are_not_found() -> None:
    local = LocalWorkflowEngine()
    for call in (local.status("nope"), local.resume("nope"), local.cancel("nope")):
        with pytest.raises(WorkflowExecutionNotFoundError, match="'nope'") as missing:
            await call
        assert isinstance(missing.value, NotFoundError)
        assert missing.value.execution_id == "nope"


def test_register_is_accepted_for_symmetry_with_the_durable_engine() -> None:
    engine = LocalWorkflowEngine()
    definition = WorkflowDefinition("approval")
    assert engine.register(definition) is definition
    assert engine.registered == {"approval": definition}
