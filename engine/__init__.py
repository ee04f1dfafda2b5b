"""duly's engine: durable workflows where a workflow is an ordinary SQLAlchemy table.

Import everything from here; the modules behind it are private.
"""

from __future__ import annotations

from engine.attempt_log import AttemptLog
from engine.connection import connect_workflows
from engine.cron import Cron
from engine.directives import every, wait_for, wake_in
from engine.errors import (
    ConfigurationError,
    DulyError,
    NotADirectiveError,
    NotConnectedError,
    NotFoundError,
    NotRunningError,
    StepError,
)
from engine.fanout import child, fan_out
from engine.handles import Handle
from engine.limits import Limit, RateBucket
from engine.steps import Call, Step, step
from engine.worker import Worker, run_workflows, wake
from engine.workflow import Workflow

__all__ = [
    "AttemptLog",
    "Call",
    "ConfigurationError",
    "Cron",
    "DulyError",
    "Handle",
    "Limit",
    "NotADirectiveError",
    "NotConnectedError",
    "NotFoundError",
    "NotRunningError",
    "RateBucket",
    "Step",
    "StepError",
    "Worker",
    "Workflow",
    "child",
    "connect_workflows",
    "every",
    "fan_out",
    "run_workflows",
    "step",
    "wait_for",
    "wake",
    "wake_in",
]
