"""Spans and metrics of step attempts with the telemetry extras, and nothing without them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from engine import connect_workflows
from engine.testing import drain
from functions import examples
from functions.app import create_app
from tests.apps import behaviour
from tests.apps.behaviour import Flaky, Timer
from tests.conftest import Database
from tests.helpers import serving

_exporter = InMemorySpanExporter()


class _WhileRecording(SimpleSpanProcessor):
    """Exports only while a test asks for spans: the provider outlives the test."""

    recording = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.recording:
            super().on_end(span)


_processor = _WhileRecording(_exporter)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished during the test (the process's tracer provider is set once)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_processor)
        trace.set_tracer_provider(provider)
    _exporter.clear()
    _processor.recording = True
    try:
        yield _exporter
    finally:
        _processor.recording = False
        _exporter.clear()


def attempts(workflow: str, step: str, outcome: str) -> float:
    labels = {"workflow": workflow, "step": step, "outcome": outcome}
    return REGISTRY.get_sample_value("duly_step_attempts_total", labels) or 0.0


async def test_every_attempt_is_a_span_with_its_run_and_attempt(
    db: Database, spans: InMemorySpanExporter
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    async with connect_workflows(Session, workflows=[Timer]):
        row = Timer()
        assert await row.start(Timer.fire)
    assert await drain(Session, [Timer]) == 1
    [span] = [s for s in spans.get_finished_spans() if s.name == "timer.fire"]
    assert dict(span.attributes or {}) == {
        "duly.workflow": "timer",
        "duly.step": "fire",
        "duly.attempt": 1,
        "duly.run_key": str(row.id),
    }
    assert span.status.is_ok


async def test_a_failing_body_records_its_exception_on_the_span_and_counts_as_retry(
    db: Database, spans: InMemorySpanExporter
) -> None:
    Session = await db.create(behaviour.Base.metadata)
    before = attempts("flaky", "work", "retry")
    behaviour.raise_in_step.append(RuntimeError("boom"))
    try:
        async with connect_workflows(Session, workflows=[Flaky]):
            assert await Flaky().start(Flaky.work)
        await drain(Session, [Flaky])
    finally:
        behaviour.raise_in_step.clear()
    [span] = [s for s in spans.get_finished_spans() if s.name == "flaky.work"]
    assert not span.status.is_ok
    assert [event.name for event in span.events] == ["exception"]
    assert attempts("flaky", "work", "retry") == before + 1


async def test_attempts_are_counted_by_outcome_and_served_at_metrics(db: Database) -> None:
    Session = await db.create(behaviour.Base.metadata, examples.Base.metadata)
    before = attempts("timer", "fire", "ok")
    async with connect_workflows(Session, workflows=[Timer]):
        for _ in range(3):
            assert await Timer().start(Timer.fire)
    assert await drain(Session, [Timer]) == 3
    assert attempts("timer", "fire", "ok") == before + 3
    seconds = REGISTRY.get_sample_value(
        "duly_step_seconds_count", {"workflow": "timer", "step": "fire"}
    )
    assert seconds is not None and seconds >= 3
    async with serving(create_app(Session, run_worker=False)) as client:
        reply = await client.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    assert 'duly_step_attempts_total{outcome="ok",step="fire",workflow="timer"}' in reply.text


def test_without_the_extras_telemetry_is_nothing_and_costs_nothing() -> None:
    """With both libraries unimportable, the engine imports and every call is a no-op.

    (The app cannot be checked so: FastAPI itself now depends on opentelemetry-api.)
    """
    script = """
import sys
sys.modules["opentelemetry"] = None
sys.modules["prometheus_client"] = None
from engine.model import telemetry
assert not telemetry.TRACING and not telemetry.METRICS
with telemetry.step_span("w", "s", 1, object()):
    pass
telemetry.attempt_finished("w", "s", "ok", 1.0)
assert telemetry.latest_metrics() is None
import engine
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
