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
