"""Execution tables and definitions for the durable engine and engine selection tests.

Importable by worker processes: a worker registers the same definitions
(`register_all`) on its own DurableWorkflowEngine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import DeclarativeBase

from engine import LocalWorkflowEngine, WorkflowDefinition, declare_engine_tables, wait_for_resume
from engine.executions.durable import DurableWorkflowEngine


class Base(DeclarativeBase):
    """The execution tests' base."""


Execution = declare_engine_tables(Base, events=False, attempts=False, executions=True).execution


class OtherBase(DeclarativeBase):
    """A second application's base, for an engine given its table explicitly."""


ArchivedExecution = declare_engine_tables(
    OtherBase,
    events=False,
    attempts=False,
    executions=True,
    names={"execution": "archived_executions"},
).execution


def approve(given: Mapping[str, Any]) -> object:
    """Waits for a resume; then approved by whoever the signal names."""
    if "resume_signal" not in given:
        return wait_for_resume()
    return {"amount": given["amount"], "approved_by": given["resume_signal"]["by"]}


async def double(given: Mapping[str, Any]) -> Mapping[str, Any]:
    await asyncio.sleep(0)
    return {"double": given["n"] * 2}


def decline(given: Mapping[str, Any]) -> None:
    raise RuntimeError(f"card {given.get('card', '?')} declined")


APPROVAL = WorkflowDefinition("approval", approve, version="2")
DOUBLING = WorkflowDefinition("doubling", double)
PAYMENT = WorkflowDefinition("payment", decline)
NOOP = WorkflowDefinition("noop")


def register_all(engine: DurableWorkflowEngine) -> DurableWorkflowEngine:
    """Register every definition above on `engine`, as each worker process must."""
    for definition in (APPROVAL, DOUBLING, PAYMENT, NOOP):
        engine.register(definition)
    return engine


# Named by dotted paths in the engine selection tests.
SHARED_ENGINE = LocalWorkflowEngine()


def make_local_engine() -> LocalWorkflowEngine:
    """A zero-argument factory of engines."""
    return LocalWorkflowEngine()


def make_nothing() -> object:
    """A factory whose product is no engine."""
    return object()


def broken_factory() -> LocalWorkflowEngine:
    """A factory that fails."""
    raise RuntimeError("the factory broke")
