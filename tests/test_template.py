"""Checks of the SAM template: cfn-lint clean, and the four functions wired up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cfnlint.api import lint_file
from cfnlint.decode.cfn_yaml import load

TEMPLATE = Path(__file__).resolve().parent.parent / "template.yaml"
HANDLERS = {
    "PublishFunction": "functions.lambda_handlers.publish",
    "WakeFunction": "functions.lambda_handlers.wake",
    "DrainFunction": "functions.lambda_handlers.drain",
    "DeliverFunction": "functions.lambda_handlers.deliver",
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


def test_wake_function_has_an_iam_function_url() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    url_config = resources["WakeFunction"]["Properties"]["FunctionUrlConfig"]
    assert url_config["AuthType"] == "AWS_IAM"
