"""Traces and metrics of step attempts, when their libraries are installed.

With `duly[tracing]` every step attempt is an OpenTelemetry span (`<workflow>.<step>`) on
the application's tracer provider; with `duly[metrics]` attempts, step times, claim sizes,
the event layer's figures and stranded runs are counted in prometheus-client's default
registry, which the app serves at `/metrics`. Without them every function here returns at
once: importing this module costs two failed imports, once. `add_emitter` hands the same
figures to another sink as they happen (on Lambda, CloudWatch's embedded metric format);
while one listens, a step's body runs with its workflow and run key as `current_run()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from engine.model.attempt_log import run_key

try:
    from opentelemetry import trace
except ImportError:  # tracing not installed
    trace = None  # type: ignore[assignment]

try:
    import prometheus_client
except ImportError:  # metrics not installed
    prometheus_client = None  # type: ignore[assignment]

# A sink of figures as they happen: the figure's name, its value, its labels.
Emitter = Callable[[str, float, Mapping[str, str]], None]

TRACING = trace is not None
METRICS = prometheus_client is not None

# Outcomes an attempt ends with: the attempt log's three, and "fenced" (its row
# moved while it ran, so nothing it did was committed).
OUTCOMES = ("ok", "retry", "failed", "fenced")

_tracer: Any = trace.get_tracer("duly") if trace is not None else None
NO_PROVIDER: tuple[type[Any], ...] = (
    (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if trace is not None else ()
)

if prometheus_client is not None:
    CLAIMED_ROWS: Any = prometheus_client.Histogram(
        "duly_claim_rows",
        "Rows one claim took, by workflow (the outbox's rows are its claim batches).",
        ["workflow"],
        buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
    )
    OUTBOX_BACKLOG: Any = prometheus_client.Gauge(
        "duly_outbox_rows",
        "Outbox rows by status, as of the last summary read (GET /outbox, duly drain).",
        ["status"],
    )
    OUTBOX_SECONDS: Any = prometheus_client.Histogram(
        "duly_outbox_route_seconds",
        "Time one drain of one event took, all its routes included.",
        buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0, 300.0),
    )
    OUTBOX_SETTLED: Any = prometheus_client.Counter(
        "duly_outbox_settled",
        "Drains of outbox rows, by the status they left the row in.",
        ["status"],
    )
    DELIVERIES: Any = prometheus_client.Counter(
        "duly_outbox_deliveries",
        "Routes' results recorded as delivery attempts, by status.",
        ["status"],
    )
    DUPLICATES: Any = prometheus_client.Counter(
        "duly_event_duplicates",
        "Published events ignored because their id was published before, by registry.",
        ["registry"],
    )
    EXECUTIONS: Any = prometheus_client.Counter(
        "duly_execution_states",
        "Workflow executions entering a state, by engine and state.",
        ["engine", "state"],
    )
    STEP_ATTEMPTS: Any = prometheus_client.Counter(
        "duly_step_attempts",
        "Step attempts, by workflow, step and outcome.",
        ["workflow", "step", "outcome"],
    )
    STRANDED: Any = prometheus_client.Gauge(
        "duly_stranded_runs",
        "Runs due for longer than the grace period at a step this worker's code does not "
        "have, by workflow and step, as of its last check (engine.claims.stranded).",
        ["workflow", "step"],
    )
    FAILED_KICKS: Any = prometheus_client.Counter(
        "duly_failed_kicks",
        "Calls to AWS after a committed write that failed (a kick or a schedule), by call; "
        "the safety-net schedule bounds the delay they cause.",
        ["call"],
    )
    STEP_SECONDS: Any = prometheus_client.Histogram(
        "duly_step_seconds",
        "Time a step's body took, by workflow and step.",
        ["workflow", "step"],
        buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0, 300.0),
    )


_children: dict[tuple[int, tuple[str, ...]], Any] = {}
_emitters: list[Emitter] = []
# The workflow and run key of the step body running in this context, while an emitter listens.
_current_run: ContextVar[tuple[str, str] | None] = ContextVar("duly_current_run", default=None)


def current_run() -> tuple[str, str] | None:
    """The workflow and run key of the step body running here (None outside one, or with no
    emitter listening): what a log line written from it is about."""
    return _current_run.get()


def add_emitter(emitter: Emitter) -> None:
    """Hand every figure below to `emitter` too, as it happens, until `remove_emitter`."""
    _emitters.append(emitter)


def remove_emitter(emitter: Emitter) -> None:
    """Stop handing figures to `emitter` (it was added)."""
    _emitters.remove(emitter)


def _emit(name: str, value: float, labels: Mapping[str, str]) -> None:
    for emitter in _emitters:
        emitter(name, value, labels)


def _child(metric: Any, *labels: str) -> Any:
    """`metric.labels(*labels)`, kept: prometheus-client's own lookup takes a lock every call."""
    key = (id(metric), labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


_NO_SPAN = contextlib.nullcontext()  # entered and left by every attempt while nothing traces


def step_span(
    workflow: str, step: str, attempt: int, row: object
) -> contextlib.AbstractContextManager[None]:
    """A span around one attempt of a step's body on `row` (nothing without tracing); while
    an emitter listens, the body's run is `current_run()` too."""
    if _emitters:
        return _in_run(workflow, step, attempt, row)
    # Until the application sets a tracer provider, a span would be a no-op that still
    # costs a context switch per attempt: skip it (FastAPI installs the API, not a provider).
    if _tracer is None or isinstance(trace.get_tracer_provider(), NO_PROVIDER):
        return _NO_SPAN
    return _span(workflow, step, attempt, row)


@contextlib.contextmanager
def _in_run(workflow: str, step: str, attempt: int, row: object) -> Iterator[None]:
    token = _current_run.set((workflow, run_key(row)))
    try:
        if _tracer is None or isinstance(trace.get_tracer_provider(), NO_PROVIDER):
            yield
        else:
            with _span(workflow, step, attempt, row):
                yield
    finally:
        _current_run.reset(token)


@contextlib.contextmanager
def _span(workflow: str, step: str, attempt: int, row: object) -> Iterator[None]:
    attributes = {
        "duly.workflow": workflow,
        "duly.step": step,
        "duly.attempt": attempt,
        "duly.run_key": run_key(row),
    }
    with _tracer.start_as_current_span(f"{workflow}.{step}", attributes=attributes):
        yield


def attempt_finished(workflow: str, step: str, outcome: str, took_ms: float) -> None:
    """Count an attempt's outcome and time its body (nothing without metrics or an emitter)."""
    if _emitters:
        _emit("step_attempts", 1, {"workflow": workflow, "step": step, "outcome": outcome})
    if prometheus_client is None:
        return
    _child(STEP_ATTEMPTS, workflow, step, outcome).inc()
    _child(STEP_SECONDS, workflow, step).observe(took_ms / 1000)


def latest_metrics() -> tuple[bytes, str] | None:
    """The default registry in Prometheus' text format and its content type; None without."""
    if prometheus_client is None:
        return None
    return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST


def rows_claimed(workflow: str, rows: int) -> None:
    """Record one claim's size for `workflow`."""
    if prometheus_client is not None:
        _child(CLAIMED_ROWS, workflow).observe(rows)


def runs_stranded(workflow: str, step: str, runs: int) -> None:
    """Set how many runs of `workflow` wait, past the grace period, at a step no worker took."""
    if _emitters:
        _emit("stranded_runs", runs, {"workflow": workflow, "step": step})
    if prometheus_client is not None:
        _child(STRANDED, workflow, step).set(runs)


def outbox_backlog(counts: dict[str, int]) -> None:
    """Set the outbox gauges from a summary's counts by status."""
    if prometheus_client is not None:
        for status, rows in counts.items():
            _child(OUTBOX_BACKLOG, status).set(rows)


def outbox_drained(status: str, seconds: float) -> None:
    """Count one drain of an outbox row by the status it left, and time it."""
    if _emitters:
        _emit("outbox_settled", 1, {"status": status})
    if prometheus_client is not None:
        _child(OUTBOX_SETTLED, status).inc()
        OUTBOX_SECONDS.observe(seconds)


def deliveries_recorded(statuses: list[str]) -> None:
    """Count delivery attempts recorded, by status."""
    if prometheus_client is not None:
        for status in statuses:
            _child(DELIVERIES, status).inc()


def duplicates_ignored(registry: str, count: int = 1) -> None:
    """Count published events ignored as duplicates."""
    if prometheus_client is not None and count:
        _child(DUPLICATES, registry).inc(count)


def execution_state(engine: str, state: str) -> None:
    """Count an execution entering `state`."""
    if prometheus_client is not None:
        _child(EXECUTIONS, engine, state).inc()


def kick_failed(call: str) -> None:
    """Count a call to AWS after a committed write that failed (`call`: kick or schedule)."""
    if _emitters:
        _emit("failed_kicks", 1, {"call": call})
    if prometheus_client is not None:
        _child(FAILED_KICKS, call).inc()
