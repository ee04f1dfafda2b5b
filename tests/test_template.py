"""Checks of the SAM template: cfn-lint clean, and the four functions wired up."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from cfnlint.api import lint_file
from cfnlint.decode.cfn_yaml import load

TEMPLATE = Path(__file__).resolve().parent.parent / "template.yaml"
HANDLERS = {
    "PublishFunction": "functions.lambdas.handlers.publish",
    "WakeFunction": "functions.lambdas.handlers.wake",
    "DrainFunction": "functions.lambdas.handlers.drain",
    "DeliverFunction": "functions.lambdas.handlers.deliver",
}


def test_cfn_lint_finds_nothing() -> None:
    # cfnlint has no __main__ module, so no `python -m cfnlint`; its API runs the same
    # rules (errors and warnings, SAM transform included) as the cfn-lint command.
    matches = lint_file(TEMPLATE)
    assert matches == [], "\n".join(str(match) for match in matches)


def test_four_functions_with_their_handlers() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    functions = {
        name: resource["Properties"]["Handler"]
        for name, resource in resources.items()
        if resource["Type"] == "AWS::Serverless::Function"
    }
    assert functions == HANDLERS


def test_the_http_api_has_an_iam_function_url() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    url_config = resources["PublishFunction"]["Properties"]["FunctionUrlConfig"]
    assert url_config["AuthType"] == "AWS_IAM"


def test_every_handler_the_template_names_imports() -> None:
    for handler in HANDLERS.values():
        module_name, _, name = handler.rpartition(".")
        assert callable(getattr(importlib.import_module(module_name), name)), handler


def test_wake_has_a_safety_net_schedule_and_bounded_concurrency() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    wake = resources["WakeFunction"]["Properties"]
    safety_net = wake["Events"]["SafetyNet"]
    assert safety_net["Type"] == "ScheduleV2"
    assert json.loads(safety_net["Properties"]["Input"]) == {"duly": "wake"}
    assert wake["ReservedConcurrentExecutions"] == {"Ref": "WakeConcurrency"}


def test_alarms_watch_the_metrics_the_functions_write_and_logs_are_kept_for_a_while() -> None:
    from functions.lambdas.metrics import DEPLOYMENT, METRICS, NAMESPACE

    template = load(str(TEMPLATE))
    resources: dict[str, Any] = template["Resources"]
    alarms = {
        name: resource["Properties"]
        for name, resource in resources.items()
        if resource["Type"] == "AWS::CloudWatch::Alarm"
    }
    written = {metric.name for metric in METRICS}
    watched = set()
    for name, alarm in alarms.items():
        assert alarm["AlarmActions"]["Fn::If"][0] == "NotifiesAlarms", name
        if "MetricName" not in alarm:  # the functions' errors, summed over the four
            stats = [m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m]
            assert {m["Dimensions"][0]["Value"]["Ref"] for m in stats} == set(HANDLERS)
            continue
        assert alarm["Namespace"] == NAMESPACE and alarm["MetricName"] in written, name
        assert alarm["Dimensions"] == [{"Name": DEPLOYMENT, "Value": {"Ref": "ScheduleGroup"}}]
        watched.add(alarm["MetricName"])
    assert watched == {"StrandedRuns", "DeadLetters", "FailedKicks"}
    groups = {
        resource["Properties"]["LogGroupName"]["Fn::Sub"]
        for resource in resources.values()
        if resource["Type"] == "AWS::Logs::LogGroup"
    }
    names = {resources[f]["Properties"]["FunctionName"]["Fn::Sub"] for f in HANDLERS}
    assert groups == {f"/aws/lambda/{name}" for name in names}
    assert template["Parameters"]["LogRetentionDays"]["Default"] == 30
