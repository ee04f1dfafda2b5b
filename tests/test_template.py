"""Checks of the SAM template: cfn-lint clean, the functions wired up, migrations first, alarms,
and the options for the database (RDS Proxy, IAM auth), the VPC's endpoints and the console URL."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import lint_file
from cfnlint.decode.cfn_yaml import load
from samtranslator.translator.transform import transform

TEMPLATE = Path(__file__).resolve().parent.parent / "template.yaml"
HANDLERS = {
    "PublishFunction": "functions.lambdas.handlers.publish",
    "WakeFunction": "functions.lambdas.handlers.wake",
    "DrainFunction": "functions.lambdas.handlers.drain",
    "DeliverFunction": "functions.lambdas.handlers.deliver",
    "MigrateFunction": "functions.lambdas.migrate.on_deploy",
}
SERVING = ("PublishFunction", "WakeFunction", "DrainFunction", "DeliverFunction")
CONSOLE = {"ConsoleFunction": "functions.lambdas.handlers.publish"}  # only with PublicConsole
README = TEMPLATE.parent / "README.md"
# The parameters "The database, the VPC and the console on AWS" documents in README.md.
DATABASE_VPC_CONSOLE_PARAMETERS = (
    "DatabaseSecretArn",
    "DatabaseHost",
    "DatabasePort",
    "DatabaseName",
    "DatabaseUser",
    "DatabaseIamAuth",
    "DatabaseResourceId",
    "DatabaseSslMode",
    "CreateDatabaseProxy",
    "DatabaseInstanceId",
    "DatabaseClusterId",
    "ProxyMaxConnectionsPercent",
    "SubnetIds",
    "SecurityGroupIds",
    "CreateVpcEndpoints",
    "VpcId",
    "PublicConsole",
    "ApiKeys",
    "OidcIssuer",
    "OidcClientId",
    "OidcAudience",
    "OidcUserClaim",
    "OidcGroupsClaim",
    "OidcClientSecretArn",
    "WebhookSecretArn",
    "ApiTokenSecretArn",
)


def test_cfn_lint_finds_nothing() -> None:
    # cfnlint has no __main__ module, so no `python -m cfnlint`; its API runs the same
    # rules (errors and warnings, SAM transform included) as the cfn-lint command.
    matches = lint_file(TEMPLATE)
    assert matches == [], "\n".join(str(match) for match in matches)


def test_the_functions_with_their_handlers() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    functions = {
        name: resource["Properties"]["Handler"]
        for name, resource in resources.items()
        if resource["Type"] == "AWS::Serverless::Function"
    }
    assert functions == HANDLERS | CONSOLE


def test_the_http_api_has_an_iam_function_url() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    url_config = resources["PublishFunction"]["Properties"]["FunctionUrlConfig"]
    assert url_config["AuthType"] == "AWS_IAM"


def test_every_handler_the_template_names_imports() -> None:
    for handler in (HANDLERS | CONSOLE).values():
        module_name, _, name = handler.rpartition(".")
        assert callable(getattr(importlib.import_module(module_name), name)), handler


def test_wake_has_a_safety_net_schedule_and_bounded_concurrency() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    wake = resources["WakeFunction"]["Properties"]
    safety_net = wake["Events"]["SafetyNet"]
    assert safety_net["Type"] == "ScheduleV2"
    assert json.loads(safety_net["Properties"]["Input"]) == {"duly": "wake"}
    assert wake["ReservedConcurrentExecutions"] == {"Ref": "WakeConcurrency"}


def test_the_serving_functions_wait_for_the_migrations_of_their_code() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    migrations = resources["Migrations"]
    assert migrations["Type"] == "Custom::DulyMigrate"
    assert migrations["Properties"]["ServiceToken"] == {"Fn::GetAtt": ["MigrateFunction", "Arn"]}
    assert int(migrations["Properties"]["ServiceTimeout"]) > int(
        resources["MigrateFunction"]["Properties"]["Timeout"]
    ), "CloudFormation waits for the function's answer, not an hour"
    for name in SERVING:
        assert resources[name]["DependsOn"] == "Migrations", name


class NoManagedPolicies:
    """The SAM transform's policy loader, offline: the template names no AWS managed policy."""

    def load(self) -> dict[str, str]:
        return {}


def test_new_code_changes_the_migrations_resource_so_update_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    def code_version(code_uri: str) -> Any:
        template: dict[str, Any] = load(str(TEMPLATE))
        template["Globals"]["Function"]["CodeUri"] = code_uri  # as sam deploy uploads it
        parameters = {"DatabaseSecretArn": "arn:aws:secretsmanager:us-east-1:1:secret:db"}
        resources = transform(template, parameters, NoManagedPolicies())["Resources"]
        return resources["Migrations"]["Properties"]["CodeVersion"]

    first = code_version("s3://artifacts/0f1e2d")
    assert first == code_version("s3://artifacts/0f1e2d")  # the same code: nothing to run
    assert first != code_version("s3://artifacts/9a8b7c")  # new code: an Update


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
            assert {m["Dimensions"][0]["Value"]["Ref"] for m in stats} == set(SERVING)
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


def test_the_public_console_url_is_made_only_when_asked_and_only_with_a_login() -> None:
    template: dict[str, Any] = load(str(TEMPLATE))
    console = template["Resources"]["ConsoleFunction"]
    assert console["Condition"] == "MakeConsoleUrl"
    assert template["Conditions"]["MakeConsoleUrl"] == {
        "Fn::Equals": [{"Ref": "PublicConsole"}, "true"]
    }
    assert console["Properties"]["FunctionUrlConfig"]["AuthType"] == "NONE"
    # The function refuses to serve with no credential set (functions/lambdas/public_url.py).
    assert console["Properties"]["Environment"]["Variables"]["DULY_PUBLIC_URL"] == "true"
    rule = template["Rules"]["PublicConsoleHasALogin"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "PublicConsole"}, "true"]}
    [assertion] = rule["Assertions"]
    eithers = assertion["Assert"]["Fn::Or"]
    refs = {either["Fn::Not"][0]["Fn::Equals"][0]["Ref"] for either in eithers}
    assert refs == {"ApiKeys", "OidcIssuer", "ApiTokenSecretArn"}


def test_secrets_come_by_dynamic_reference_never_as_parameters() -> None:
    template: dict[str, Any] = load(str(TEMPLATE))
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    for variable, parameter in (
        ("DULY_WEBHOOK_SECRET", "WebhookSecretArn"),
        ("DULY_API_TOKEN", "ApiTokenSecretArn"),
        ("DULY_OIDC_CLIENT_SECRET", "OidcClientSecretArn"),
    ):
        _, reference, _ = variables[variable]["Fn::If"]
        assert reference == {
            "Fn::Sub": "{{resolve:secretsmanager:${" + parameter + "}:SecretString}}"
        }
        assert template["Parameters"][parameter]["AllowedPattern"].startswith("^$|^arn:")


def test_the_proxy_is_an_option_the_functions_then_connect_through() -> None:
    template: dict[str, Any] = load(str(TEMPLATE))
    resources = template["Resources"]
    for name, kind in (
        ("DatabaseProxy", "AWS::RDS::DBProxy"),
        ("DatabaseProxyTargetGroup", "AWS::RDS::DBProxyTargetGroup"),
        ("DatabaseProxyRole", "AWS::IAM::Role"),
    ):
        assert (resources[name]["Type"], resources[name]["Condition"]) == (kind, "UseProxy")
    proxy = resources["DatabaseProxy"]["Properties"]
    assert (proxy["EngineFamily"], proxy["RequireTLS"]) == ("POSTGRESQL", True)
    assert proxy["Auth"][0]["SecretArn"] == {"Ref": "DatabaseSecretArn"}
    host = template["Globals"]["Function"]["Environment"]["Variables"]["DULY_DATABASE_HOST"]
    proxy_endpoint = {"Fn::GetAtt": ["DatabaseProxy", "Endpoint"]}
    assert host == {"Fn::If": ["UseProxy", proxy_endpoint, {"Ref": "DatabaseHost"}]}


def test_the_vpc_endpoints_are_those_of_what_duly_calls() -> None:
    resources: dict[str, Any] = load(str(TEMPLATE))["Resources"]
    endpoints = {
        resource["Properties"]["ServiceName"]["Fn::Sub"]
        for resource in resources.values()
        if resource["Type"] == "AWS::EC2::VPCEndpoint"
        and resource["Condition"] == "MakeVpcEndpoints"
    }
    assert endpoints == {
        f"com.amazonaws.${{AWS::Region}}.{service}"
        for service in ("secretsmanager", "scheduler", "lambda")
    }


def test_the_database_vpc_and_console_parameters_are_documented() -> None:
    parameters: dict[str, Any] = load(str(TEMPLATE))["Parameters"]
    readme = README.read_text()
    assert set(DATABASE_VPC_CONSOLE_PARAMETERS) <= set(parameters)
    undocumented = [p for p in DATABASE_VPC_CONSOLE_PARAMETERS if f"| `{p}` |" not in readme]
    assert undocumented == [], "README's table of the database, VPC and console parameters"


def test_every_parameter_is_in_a_readme_table() -> None:
    parameters: dict[str, Any] = load(str(TEMPLATE))["Parameters"]
    readme = README.read_text()
    assert [p for p in parameters if f"| `{p}` |" not in readme] == []
