"""On Lambda: a kick that cannot reach AWS fails no write; JSON log lines; EMF metrics.

- a start whose kick cannot reach AWS answers 201, logs one warning, and the next wake
  (a Scheduler event, AWS reachable again) works the run:
  test_a_start_whose_kick_cannot_reach_aws_answers_201_and_the_next_wake_works_it
- a schedule write that cannot reach AWS is a warning, and the wake answers:
  test_a_failed_schedule_write_is_a_warning_and_the_wake_still_answers
- a handler's log lines are JSON with the invocation's request id:
  test_a_handlers_log_lines_are_json_with_the_request_id; a line from a step's body names
  its workflow and run key: test_a_wake_writes_its_metrics_in_embedded_metric_format
- the metrics are EMF documents (directive, namespace, dimensions, values):
  test_a_wake_writes_its_metrics_in_embedded_metric_format,
  test_failed_attempts_dead_letters_and_stranded_runs_as_emf
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from engine.events.statuses import DEAD_LETTER
from engine.model import telemetry
from functions.lambdas import handlers as lambda_handlers, observing
from functions.lambdas.json_logs import JsonFormatter
from functions.lambdas.metrics import NAMESPACE, EmbeddedMetrics
from functions.lambdas.runtime import WAKE_INPUT, Runtime, install
from tests.apps.serverless_app import SIGNUP
from tests.aws_fakes import (
    Aws,
    Context,
    aws_client,
    create_tables,
    function,
    function_url_event,
    moto_scheduler,
    one_signup,
    settings_for,
)
from tests.conftest import Database

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")

OPS = "arn:aws:iam::123456789012:role/ops"
REQUEST_ID = "c6af9ac6-7b61-11e6-9a41-93e8deadbeef"


@pytest.fixture
def on_lambda(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """This process looks like a Lambda container, whose runtime's handler writes the root
    logger's lines (to the stream given); plain lines and no metrics again after."""
    monkeypatch.setenv(observing.LAMBDA_VARIABLE, "duly-test-wake")
    root = logging.getLogger()
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        yield written
    finally:
        observing.stop_observing()
        root.removeHandler(handler)
        root.setLevel(level)


def log_lines(err: str) -> list[dict[str, Any]]:
    """The JSON log lines among stderr's."""
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def closed_port() -> int:
    """A loopback port nothing listens on: connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def call_in_container(rt: Runtime, entry: Any, event: Any) -> dict[str, Any]:
    """`entry(event, context)` as Lambda calls it, on a thread of its own, `rt` installed."""

    def invoke() -> dict[str, Any]:
        install(rt)
        return entry(event, Context(30.0, aws_request_id=REQUEST_ID))  # type: ignore[no-any-return]

    with ThreadPoolExecutor(1) as thread:
        try:
            return await asyncio.get_running_loop().run_in_executor(thread, invoke)
        finally:
            await asyncio.get_running_loop().run_in_executor(thread, rt.close)


async def test_a_start_whose_kick_cannot_reach_aws_answers_201_and_the_next_wake_works_it(
    db: Database,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    on_lambda: io.StringIO,
) -> None:
    monkeypatch.setenv("DULY_ROLES", json.dumps({f"iam:{OPS}": ["operator"]}))
    Session = await create_tables(db)
    aws = Aws(moto_endpoint)
    settings = settings_for(db, aws.group)
    unreachable = f"http://127.0.0.1:{closed_port()}"
    # A container in a VPC without a NAT or endpoints: the real invoke, through boto3.
    cut_off = Runtime(settings, clients=lambda service: aws_client(unreachable, service))
    start = {"row": {"email": "ada@example.com"}, "step": "welcome"}
    event = function_url_event("POST", "/workflows/lambda_signup/start", start, caller=OPS)
    answer = await call_in_container(cut_off, lambda_handlers.http, event)
    assert answer["statusCode"] == 201, answer
    assert (await one_signup(Session)).status == "new", "the run was committed, due now"
    out = capfd.readouterr().out
    lines = log_lines(on_lambda.getvalue())
    [said] = [line for line in lines if line["level"] in ("WARNING", "ERROR")]
    assert (said["logger"], said["request_id"]) == ("duly.kicks", REQUEST_ID), said
    assert said["message"].startswith("Could not invoke the wake function: EndpointConnection")
    assert "ada@example.com" not in said["message"] and "error" not in said, "no payload"
    [kicks] = [d for d in emf_documents(out) if "FailedKicks" in d]
    assert (kicks["FailedKicks"], kicks["Call"], kicks["Deployment"]) == (1, "kick", aws.group)

    # The next wake, from the Scheduler (the safety net's own event), with AWS reachable.
    async with function(settings, aws=aws) as fn:
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
    assert woken["caught_up"] is True and woken["steps"] == 1, woken
    assert (await one_signup(Session)).status == "welcomed"
    assert len(aws.schedules()) == 1, "the nudge two hours on is registered"


async def test_a_failed_schedule_write_is_a_warning_and_the_wake_still_answers(
    db: Database, capfd: pytest.CaptureFixture[str], on_lambda: io.StringIO
) -> None:
    Session = await create_tables(db)
    settings = settings_for(db)
    unreachable = f"http://127.0.0.1:{closed_port()}"
    cut_off = Runtime(
        settings,
        scheduler=moto_scheduler,
        invoke=lambda: asyncio.sleep(0),
        clients=lambda service: aws_client(unreachable, service),
    )
    async with function(settings) as fn:  # the signup's run, started by its event
        event = {"event_type": SIGNUP, "event_id": "s-9", "payload": {"email": "bo@example.com"}}
        await fn.call(lambda_handlers.publish, event)
    on_lambda.seek(0)
    on_lambda.truncate()
    capfd.readouterr()
    woken = await call_in_container(cut_off, lambda_handlers.wake, WAKE_INPUT)
    assert woken["caught_up"] is True, woken
    assert (await one_signup(Session)).status == "welcomed", "the steps committed"
    lines = log_lines(on_lambda.getvalue())
    failures = [line for line in lines if line["level"] in ("WARNING", "ERROR")]
    assert failures, "the failed registrations were logged"
    for line in failures:  # one a registration the worker asked for (each instant it told)
        assert line["message"].startswith(
            "Could not register the next wake-up with EventBridge Scheduler: "
            "EndpointConnectionError"
        )
        assert "error" not in line, "a warning, with no traceback"
        assert line["request_id"] == REQUEST_ID
    [counted] = [d for d in emf_documents(capfd.readouterr().out) if "FailedKicks" in d]
    assert (counted["FailedKicks"], counted["Call"]) == (len(failures), "schedule")


async def test_a_handlers_log_lines_are_json_with_the_request_id(
    db: Database, on_lambda: io.StringIO
) -> None:
    await create_tables(db)
    cut_off = Runtime(settings_for(db), invoke=lambda: asyncio.sleep(0))
    refused = await call_in_container(cut_off, lambda_handlers.publish, {"events": "not a list"})
    assert refused["type"] == "InputError"
    logging.getLogger("duly.lambda").warning("after the invocation")
    lines = log_lines(on_lambda.getvalue())
    refusal = next(line for line in lines if "refused its input" in line["message"])
    assert refusal["request_id"] == REQUEST_ID, refusal
    assert (refusal["level"], refusal["logger"]) == ("INFO", "duly.lambda")
    assert "timestamp" in refusal
    after = next(line for line in lines if line["message"] == "after the invocation")
    assert after["request_id"] is None, "a line between invocations belongs to none"


def test_a_lines_extra_workflow_and_run_key_are_fields(on_lambda: io.StringIO) -> None:
    record = logging.LogRecord("app", logging.INFO, __file__, 1, "charged %s", ("ada",), None)
    assert set(json.loads(JsonFormatter().format(record))) == {
        "timestamp",
        "level",
        "logger",
        "message",
        "request_id",
    }, "outside a step, no run"
    record.workflow, record.run_key = "orders", "42"
    said = json.loads(JsonFormatter().format(record))
    assert (said["workflow"], said["run_key"], said["message"]) == ("orders", "42", "charged ada")


def emf_documents(out: str) -> list[dict[str, Any]]:
    """The EMF documents among stdout's lines."""
    found = []
    for line in out.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            found.append(json.loads(line))
    return found


async def test_a_wake_writes_its_metrics_in_embedded_metric_format(
    db: Database, capfd: pytest.CaptureFixture[str], on_lambda: io.StringIO
) -> None:
    Session = await create_tables(db)
    async with function(settings_for(db, "duly-metrics")) as fn:
        event = {"event_type": SIGNUP, "event_id": "s-3", "payload": {"email": "cy@example.com"}}
        await fn.call(lambda_handlers.publish, event)
        capfd.readouterr()
        woken = await fn.call(lambda_handlers.wake, WAKE_INPUT)
    signup = await one_signup(Session)
    assert woken["steps"] == 2 and signup.status == "welcomed"
    [welcomed] = [x for x in log_lines(on_lambda.getvalue()) if x["logger"] == "tests.signup"]
    assert (welcomed["workflow"], welcomed["run_key"]) == ("lambda_signup", str(signup.id))
    assert uuid.UUID(welcomed["request_id"]), "the wake invocation's own id"
    documents = emf_documents(capfd.readouterr().out)
    for document in documents:
        [directive] = document["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == NAMESPACE
        assert isinstance(document["_aws"]["Timestamp"], int)
        [metric] = directive["Metrics"]
        assert isinstance(document[metric["Name"]], int | float)
        for dimensions in directive["Dimensions"]:
            assert dimensions[0] == "Deployment"
            assert all(isinstance(document[name], str) for name in dimensions)
        assert document["Deployment"] == "duly-metrics"
    by_name = {d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"]: d for d in documents}
    [steps] = [d for d in documents if d.get("Workflow") == "lambda_signup"]
    assert (steps["Workflow"], steps["Step"], steps["Outcome"], steps["StepAttempts"]) == (
        "lambda_signup",
        "welcome",
        "ok",
        1,
    )
    assert steps["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        ["Deployment", "Outcome"],
        ["Deployment", "Workflow", "Outcome"],
    ]
    duration = by_name["WakeDuration"]
    assert duration["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [
        {"Name": "WakeDuration", "Unit": "Milliseconds"}
    ]
    assert duration["WakeDuration"] > 0
    assert "FailedKicks" not in by_name and "FailedAttempts" not in by_name


def test_failed_attempts_dead_letters_and_stranded_runs_as_emf() -> None:
    lines: list[str] = []
    metrics = EmbeddedMetrics("prod", write=lines.append)
    telemetry.add_emitter(metrics)
    try:
        telemetry.attempt_finished("orders", "charge", "retry", 3.0)
        telemetry.attempt_finished("orders", "charge", "failed", 3.0)
        telemetry.outbox_drained(DEAD_LETTER, 0.1)
        telemetry.outbox_drained("processed", 0.1)
        telemetry.runs_stranded("orders", "ship", 4)
        telemetry.runs_stranded("orders", "ship", 2)  # a gauge: the last reading counts
    finally:
        telemetry.remove_emitter(metrics)
    metrics.flush()
    documents = [json.loads(line) for line in lines]
    figures = {
        (d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"], d.get("Outcome")): d
        for d in documents
    }
    assert figures["FailedAttempts", None]["FailedAttempts"] == 2
    assert figures["FailedAttempts", None]["Workflow"] == "orders"
    assert figures["StepAttempts", "retry"]["StepAttempts"] == 1
    assert figures["DeadLetters", None]["DeadLetters"] == 1
    assert figures["DeadLetters", None]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        ["Deployment"]
    ]
    stranded = figures["StrandedRuns", None]
    assert (stranded["StrandedRuns"], stranded["Step"]) == (2, "ship")
    assert stranded["Deployment"] == "prod"
    assert metrics.flush() == [], "a flush writes each figure once"
