"""What a Lambda container reports beside its answers: JSON log lines and EMF metrics.

On Lambda (the runtime sets AWS_LAMBDA_FUNCTION_NAME) the first invocation turns both
on for the container's life: `functions.lambdas.json_logs` and an
`functions.lambdas.metrics.EmbeddedMetrics` listening to `engine.model.telemetry`.
`invocation(context, deployment)` brackets each invocation: its request id on the log
lines, its metrics flushed at its end. Elsewhere (`duly dev`, tests) nothing changes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from engine import telemetry
from functions.lambdas.json_logs import invocation_started, restore_logs, use_json_logs
from functions.lambdas.metrics import WAKE_DURATION, EmbeddedMetrics

LAMBDA_VARIABLE = "AWS_LAMBDA_FUNCTION_NAME"  # set by the Lambda runtime (and `sam local`)

_metrics: list[EmbeddedMetrics] = []  # the container's, once observing


def on_lambda(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a Lambda container."""
    return bool((os.environ if environ is None else environ).get(LAMBDA_VARIABLE))


def start_observing(deployment: str) -> EmbeddedMetrics:
    """JSON log lines and EMF metrics from now on (once per process); the metrics."""
    if not _metrics:
        use_json_logs()
        metrics = EmbeddedMetrics(deployment)
        telemetry.add_emitter(metrics)
        _metrics.append(metrics)
    return _metrics[0]


def stop_observing() -> None:
    """Plain log lines and no metrics again (tests)."""
    for metrics in _metrics:
        telemetry.remove_emitter(metrics)
    _metrics.clear()
    restore_logs()


@contextlib.contextmanager
def invocation(context: Any, deployment: str) -> Iterator[None]:
    """One invocation, observed on Lambda: its request id on every line, its metrics flushed
    when it ends (however it ends)."""
    if not _metrics and not on_lambda():
        yield
        return
    metrics = start_observing(deployment)
    invocation_started(getattr(context, "aws_request_id", None))
    try:
        yield
    finally:
        metrics.flush()
        invocation_started(None)


def wake_finished(seconds: float) -> None:
    """Record how long one wake cycle took (nothing when not observing)."""
    for metrics in _metrics:
        metrics.add(WAKE_DURATION, seconds * 1000)
