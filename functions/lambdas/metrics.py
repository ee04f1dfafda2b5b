"""CloudWatch metrics on Lambda: the engine's figures written in embedded metric format.

`EmbeddedMetrics` is an emitter of `engine.model.telemetry` that sums one invocation's
figures; `flush()`, at the invocation's end, writes them as JSON lines on stdout, which
CloudWatch Logs turns into metrics of NAMESPACE with no call to AWS. Every metric has the
dimension `Deployment` (the deployment's schedule group: the stack's name in the
template); those about a workflow also have `Workflow`. Why: docs/architecture.md.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine import DEAD_LETTER

NAMESPACE = "duly"
DEPLOYMENT = "Deployment"
FAILED_OUTCOMES = frozenset({"retry", "failed"})  # an attempt that raised (or could not commit)


@dataclass(frozen=True)
class Metric:
    """One CloudWatch metric: its unit, its dimension sets, and whether it is a gauge."""

    name: str
    unit: str
    dimensions: tuple[tuple[str, ...], ...]
    gauge: bool = False  # the last value counts, not the sum


STEP_ATTEMPTS = Metric(
    "StepAttempts", "Count", ((DEPLOYMENT, "Outcome"), (DEPLOYMENT, "Workflow", "Outcome"))
)
FAILED_ATTEMPTS = Metric("FailedAttempts", "Count", ((DEPLOYMENT,), (DEPLOYMENT, "Workflow")))
STRANDED_RUNS = Metric(
    "StrandedRuns", "Count", ((DEPLOYMENT,), (DEPLOYMENT, "Workflow")), gauge=True
)
DEAD_LETTERS = Metric("DeadLetters", "Count", ((DEPLOYMENT,),))
FAILED_KICKS = Metric("FailedKicks", "Count", ((DEPLOYMENT,),))
WAKE_DURATION = Metric("WakeDuration", "Milliseconds", ((DEPLOYMENT,),))
METRICS = (STEP_ATTEMPTS, FAILED_ATTEMPTS, STRANDED_RUNS, DEAD_LETTERS, FAILED_KICKS, WAKE_DURATION)

Labels = tuple[tuple[str, str], ...]  # dimensions and properties, sorted by name


def write_line(line: str) -> None:
    """One line on stdout, where the Lambda runtime hands it to CloudWatch Logs."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class EmbeddedMetrics:
    """One container's figures since the last flush, written as EMF documents."""

    def __init__(
        self,
        deployment: str,
        namespace: str = NAMESPACE,
        write: Callable[[str], None] = write_line,
    ) -> None:
        self.deployment = deployment
        self.namespace = namespace
        self._write = write
        self._values: dict[tuple[Metric, Labels], float] = {}
        self._lock = threading.Lock()  # a synchronous step's figures come from its thread

    def __call__(self, name: str, value: float, labels: Mapping[str, str]) -> None:
        """The telemetry emitter: a figure as the engine counts it, as CloudWatch's metrics."""
        if name == "step_attempts":
            outcome = labels["outcome"]
            step = labels["step"]
            self.add(STEP_ATTEMPTS, 1, Workflow=labels["workflow"], Outcome=outcome, Step=step)
            if outcome in FAILED_OUTCOMES:
                self.add(FAILED_ATTEMPTS, 1, Workflow=labels["workflow"], Step=step)
        elif name == "stranded_runs":
            self.add(STRANDED_RUNS, value, Workflow=labels["workflow"], Step=labels["step"])
        elif name == "outbox_settled" and labels["status"] == DEAD_LETTER:
            self.add(DEAD_LETTERS, 1)
        elif name == "failed_kicks":
            self.add(FAILED_KICKS, 1, Call=labels["call"])

    def add(self, metric: Metric, value: float, **labels: str) -> None:
        """Count `value` (a gauge: set it) under `labels`; those that are not one of the
        metric's dimensions are written beside it as properties (Logs Insights reads them)."""
        key = (metric, tuple(sorted(labels.items())))
        with self._lock:
            if metric.gauge:
                self._values[key] = value
            else:
                self._values[key] = self._values.get(key, 0.0) + value

    def flush(self) -> list[dict[str, object]]:
        """Write the figures since the last flush, one EMF document each; the documents."""
        with self._lock:
            values, self._values = self._values, {}
        documents = [
            self.document(metric, dict(labels), value) for (metric, labels), value in values.items()
        ]
        for document in documents:
            self._write(json.dumps(document, separators=(",", ":")))
        return documents

    def document(self, metric: Metric, labels: dict[str, str], value: float) -> dict[str, object]:
        """One EMF document: the directive naming the metric and its dimension sets, then
        the dimensions' values, the properties and the value at the top level."""
        labels = {DEPLOYMENT: self.deployment, **labels}
        dimensions = [list(names) for names in metric.dimensions]
        directive = {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": self.namespace,
                    "Dimensions": dimensions,
                    "Metrics": [{"Name": metric.name, "Unit": metric.unit}],
                }
            ],
        }
        return {"_aws": directive, **labels, metric.name: value}
