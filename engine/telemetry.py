"""Traces and metrics of step attempts, when their libraries are installed.

`pip install duly[tracing]` gives every step attempt an OpenTelemetry span
(`<workflow>.<step>`, with the run's key and attempt number, the exception
recorded when the body raises) on whatever tracer provider the application
configured. `pip install duly[metrics]` counts attempts by outcome and times
step bodies in prometheus-client's default registry, which the app serves at
`/metrics`. Without them, every function here returns at once: importing
this module costs two failed imports, once. (FastAPI itself depends on
opentelemetry-api, so the API is usually there; with no tracer provider
configured its spans are OpenTelemetry's own no-ops.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from engine.attempt_log import run_key

try:
    from opentelemetry import trace
except ImportError:  # tracing not installed
    trace = None  # type: ignore[assignment]

try:
    import prometheus_client
except ImportError:  # metrics not installed
    prometheus_client = None  # type: ignore[assignment]

TRACING = trace is not None
METRICS = prometheus_client is not None

# Outcomes an attempt ends with: the attempt log's three, and "fenced" (its row
# moved while it ran, so nothing it did was committed).
OUTCOMES = ("ok", "retry", "failed", "fenced")

_tracer: Any = trace.get_tracer("duly") if trace is not None else None

if prometheus_client is not None:
    STEP_ATTEMPTS: Any = prometheus_client.Counter(
        "duly_step_attempts",
        "Step attempts, by workflow, step and outcome.",
        ["workflow", "step", "outcome"],
    )
    STEP_SECONDS: Any = prometheus_client.Histogram(
        "duly_step_seconds",
        "Time a step's body took, by workflow and step.",
        ["workflow", "step"],
        buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0, 300.0),
    )


@contextlib.contextmanager
def step_span(workflow: str, step: str, attempt: int, row: object) -> Iterator[None]:
    """A span around one attempt of a step's body on `row` (nothing without tracing)."""
    if _tracer is None:
        yield
        return
    attributes = {
        "duly.workflow": workflow,
        "duly.step": step,
        "duly.attempt": attempt,
        "duly.run_key": run_key(row),
    }
    with _tracer.start_as_current_span(f"{workflow}.{step}", attributes=attributes):
        yield


def attempt_finished(workflow: str, step: str, outcome: str, took_ms: float) -> None:
    """Count an attempt's outcome and time its body (nothing without metrics)."""
    if prometheus_client is None:
        return
    STEP_ATTEMPTS.labels(workflow, step, outcome).inc()
    STEP_SECONDS.labels(workflow, step).observe(took_ms / 1000)


def latest_metrics() -> tuple[bytes, str] | None:
    """The default registry in Prometheus' text format and its content type; None without."""
    if prometheus_client is None:
        return None
    return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST
