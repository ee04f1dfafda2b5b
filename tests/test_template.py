"""Checks of the SAM template: cfn-lint and checkov clean, the functions wired up, migrations
first, the safeguards of every function, only Function URLs invoking the HTTP functions, alarms,
and the options for the database (RDS Proxy, IAM auth, an Aurora cluster that pauses), the VPC's
endpoints, the console URL and SnapStart."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import lint_file
from cfnlint.decode.cfn_yaml import load
from samtranslator.translator.transform import transform

from engine.base import settings as variables

TEMPLATE = Path(__file__).resolve().parent.parent / "template.yaml"
HANDLERS = {
    "PublishFunction": "functions.lambdas.handlers.publish",
    "ApiFunction": "functions.lambdas.handlers.http",
    "WakeFunction": "functions.lambdas.handlers.wake",
    "DrainFunction": "functions.lambdas.handlers.drain",
    "DeliverFunction": "functions.lambdas.handlers.deliver",
    "MigrateFunction": "functions.lambdas.migrate.on_deploy",
}
SERVING = ("PublishFunction", "ApiFunction", "WakeFunction", "DrainFunction", "DeliverFunction")
CONSOLE = {"ConsoleFunction": "functions.lambdas.handlers.http"}  # only with PublicConsole
HTTP_FUNCTIONS = ("ApiFunction", "ConsoleFunction")  # invoked by their Function URLs only
# Invoked asynchronously (Scheduler, a kick, CloudFormation, a caller's InvocationType Event).
ASYNC_FUNCTIONS = (
    "PublishFunction",
    "WakeFunction",
    "DrainFunction",
    "DeliverFunction",
    "MigrateFunction",
)
REFERENCE = TEMPLATE.parent / "docs" / "reference" / "template.md"
# The parameters of the database, the VPC and the console: their sections of the reference.
DATABASE_VPC_CONSOLE_SECTIONS = ("The database", "The VPC", "The console and its logins")
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
    "DatabasePauses",
    "CreateAuroraDatabase",
    "SecondsUntilAutoPause",
    "AuroraMaxCapacity",
    "AuroraEngineVersion",
    "SubnetIds",
    "SecurityGroupIds",
    "CreateVpcEndpoints",
    "VpcId",
    "RouteTableIds",
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


def test_the_http_api_has_an_iam_function_url_and_publish_none() -> None:
    template: dict[str, Any] = load(str(TEMPLATE))
    resources = template["Resources"]
    url_config = resources["ApiFunction"]["Properties"]["FunctionUrlConfig"]
    assert url_config["AuthType"] == "AWS_IAM"
    assert "FunctionUrlConfig" not in resources["PublishFunction"]["Properties"]
    url = {"Fn::GetAtt": ["ApiFunctionUrl", "FunctionUrl"]}
    assert template["Outputs"]["ApiUrl"]["Value"] == url
    assert "PublishFunctionUrl" not in json.dumps(template)


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
    for name in (*SERVING, "ConsoleFunction"):
        assert "Migrations" in resources[name]["DependsOn"], name


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
        if "MetricName" not in alarm:  # the functions' errors, summed over all that serve
            assert functions_summed(alarm) == {*SERVING, "ConsoleFunction"}
            continue
        if alarm["Namespace"] == "AWS/SQS":  # asynchronous invocations that failed every retry
            queue = {"Fn::GetAtt": ["FailedInvocationsQueue", "QueueName"]}
            assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": queue}]
            continue
        assert alarm["Namespace"] == NAMESPACE and alarm["MetricName"] in written, name
        assert alarm["Dimensions"] == [{"Name": DEPLOYMENT, "Value": {"Ref": "ScheduleGroup"}}]
        watched.add(alarm["MetricName"])
    assert watched == {"StrandedRuns", "DeadLetters", "FailedKicks"}
    groups = {
        resource["Properties"]["LogGroupName"]["Fn::Sub"]: name
        for name, resource in resources.items()
        if resource["Type"] == "AWS::Logs::LogGroup"
    }
    for function in HANDLERS | CONSOLE:
        properties = resources[function]["Properties"]
        group = groups.pop(f"/aws/lambda/{properties['FunctionName']['Fn::Sub']}")
        assert group in as_list(resources[function]["DependsOn"]), "made before Lambda makes it"
        kept = resources[group]
        assert kept.get("Condition") == resources[function].get("Condition"), group
        assert kept["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
        assert kept["Properties"]["KmsKeyId"] == WITH_KEY, group
    assert groups == {}, "a log group of no function"
    assert template["Parameters"]["LogRetentionDays"]["Default"] == 30


WITH_KEY = {"Fn::If": ["HasKmsKey", {"Ref": "KmsKeyArn"}, {"Ref": "AWS::NoValue"}]}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def functions_summed(alarm: dict[str, Any]) -> set[str]:
    """The functions whose Errors the alarm's expression sums, under any condition."""
    summed: set[str] = set()
    for metric in alarm["Metrics"]:
        if "Fn::If" in metric:
            condition, metric, otherwise = metric["Fn::If"]
            assert (condition, otherwise) == ("MakeConsoleUrl", {"Ref": "AWS::NoValue"})
        if "MetricStat" not in metric:
            continue
        stat = metric["MetricStat"]["Metric"]
        assert (stat["Namespace"], stat["MetricName"]) == ("AWS/Lambda", "Errors")
        summed.add(stat["Dimensions"][0]["Value"]["Ref"])
    [expression] = [m["Expression"] for m in alarm["Metrics"] if "Expression" in m]
    condition, with_console, without = expression["Fn::If"]
    assert condition == "MakeConsoleUrl" and "console" in with_console
    assert "console" not in without and without.count(",") == with_console.count(",") - 1
    return summed


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
    aurora_endpoint = {"Fn::GetAtt": ["AuroraCluster", "Endpoint.Address"]}
    otherwise = {"Fn::If": ["MakeAurora", aurora_endpoint, {"Ref": "DatabaseHost"}]}
    assert host == {"Fn::If": ["UseProxy", proxy_endpoint, otherwise]}


def test_the_vpc_endpoints_are_those_of_what_duly_calls() -> None:
    template: dict[str, Any] = load(str(TEMPLATE))
    endpoints = {
        resource["Properties"]["ServiceName"]["Fn::Sub"]: resource["Properties"]
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::EC2::VPCEndpoint"
        and resource["Condition"] == "MakeVpcEndpoints"
    }
    assert set(endpoints) == {
        f"com.amazonaws.${{AWS::Region}}.{service}"
        for service in ("secretsmanager", "scheduler", "lambda", "s3")
    }
    # The migrate function answers CloudFormation by a PUT to a pre-signed S3 URL: a gateway
    # endpoint on the subnets' route tables carries it out of a VPC with no NAT.
    s3 = endpoints.pop("com.amazonaws.${AWS::Region}.s3")
    assert s3["VpcEndpointType"] == "Gateway"
    assert s3["RouteTableIds"] == {"Ref": "RouteTableIds"}
    assert {e["VpcEndpointType"] for e in endpoints.values()} == {"Interface"}
    rule = template["Rules"]["EndpointsHaveAVpc"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "CreateVpcEndpoints"}, "true"]}
    asserted = json.dumps([assertion["Assert"] for assertion in rule["Assertions"]])
    assert '{"Fn::EachMemberEquals": [{"Ref": "RouteTableIds"}, ""]}' in asserted
    assert "S3" in template["Description"] and "CreateVpcEndpoints" in template["Description"]


def reference_sections() -> dict[str, str]:
    """docs/reference/template.md's sections, by heading."""
    parts = REFERENCE.read_text().split("\n## ")[1:]
    return {part.partition("\n")[0]: part for part in parts}


def test_the_database_vpc_and_console_parameters_are_documented() -> None:
    parameters: dict[str, Any] = load(str(TEMPLATE))["Parameters"]
    assert set(DATABASE_VPC_CONSOLE_PARAMETERS) <= set(parameters)
    sections = reference_sections()
    documented = "".join(sections[heading] for heading in DATABASE_VPC_CONSOLE_SECTIONS)
    undocumented = [p for p in DATABASE_VPC_CONSOLE_PARAMETERS if f"| `{p}` |" not in documented]
    assert undocumented == [], "the reference's database, VPC and console parameters"


def test_every_parameter_is_in_a_reference_table_with_its_description() -> None:
    parameters: dict[str, Any] = load(str(TEMPLATE))["Parameters"]
    rows = {
        line.split(" | ")[0].removeprefix("| `").removesuffix("`"): line
        for line in REFERENCE.read_text().splitlines()
        if line.startswith("| `")
    }
    assert [p for p in parameters if p not in rows] == []
    for name, parameter in parameters.items():
        shown = " ".join(parameter["Description"].split()).replace("<", "&lt;")  # not a tag
        assert shown in rows[name], name


# -- what reaches the HTTP functions, and each function's safeguards --------------------------


def transformed(**parameters: str) -> dict[str, Any]:
    """The template as CloudFormation runs it, after the SAM transform, offline."""
    template: dict[str, Any] = load(str(TEMPLATE))
    template["Globals"]["Function"]["CodeUri"] = "s3://artifacts/0f1e2d"  # as sam deploy has it
    given = {"DatabaseSecretArn": "arn:aws:secretsmanager:us-east-1:1:secret:db", **parameters}
    transformed: dict[str, Any] = transform(template, given, NoManagedPolicies())
    return transformed


def test_only_their_function_urls_invoke_the_http_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    resources = transformed(PublicConsole="true", ApiKeys='{"k": "0"}')["Resources"]
    # Every permission on an HTTP function is its URL's: InvokeFunctionUrl, or InvokeFunction
    # only as the URL's invocation (lambda:InvokedViaFunctionUrl), never a hand-made event.
    permissions = [
        resource["Properties"]
        for resource in resources.values()
        if resource["Type"] == "AWS::Lambda::Permission"
    ]
    seen: dict[str, set[str]] = {name: set() for name in HTTP_FUNCTIONS}
    for properties in permissions:
        target = json.dumps(properties["FunctionName"])
        for name in HTTP_FUNCTIONS:
            if name in target:
                seen[name].add(properties["Action"])
        if not any(name in target for name in HTTP_FUNCTIONS):
            continue
        if properties["Action"] != "lambda:InvokeFunctionUrl":
            assert properties["Action"] == "lambda:InvokeFunction", properties
            assert properties["InvokedViaFunctionUrl"] is True, properties
    # The public URL's two (SAM's); the IAM URL's callers need a policy of their own.
    assert seen == {"ApiFunction": set(), "ConsoleFunction": INVOKED_BY_URL}, seen
    # No role or policy of the template grants lambda:InvokeFunction but on wake.
    wake = "function:${AWS::StackName}-wake"
    for name, resource in resources.items():
        for statement in granted(resource):
            actions = as_list(statement["Action"])
            if not any(a.startswith("lambda:Invoke") or a == "lambda:*" for a in actions):
                continue
            assert actions == ["lambda:InvokeFunction"], (name, statement)
            for target in map(json.dumps, as_list(statement["Resource"])):
                assert wake in target or target in WAKE_TARGETS, (name, target)
    # The handlers the other functions' code answers hand-made events with.
    for function, handler in (HANDLERS | CONSOLE).items():
        assert resources[function]["Properties"]["Handler"] == handler


INVOKED_BY_URL = {"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"}
# The wake function as SAM's resources name it: itself, or its alias (the safety net's target).
WAKE_TARGETS = ('{"Fn::GetAtt": ["WakeFunction", "Arn"]}', '{"Ref": "WakeFunctionAliaslive"}')


def granted(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """The Allow statements of a role's inline policies or a managed policy."""
    properties = resource.get("Properties", {})
    documents = [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
    if resource["Type"] == "AWS::IAM::ManagedPolicy":
        documents.append(properties["PolicyDocument"])
    statements = []
    for document in documents:
        for statement in as_list(document["Statement"]):
            if "Fn::If" in statement:
                statement = statement["Fn::If"][1]
            if statement.get("Effect") == "Allow":
                statements.append(statement)
    return statements


def test_every_function_is_bounded_and_keeps_its_failed_asynchronous_invocations() -> None:
    template: dict[str, Any] = load(str(TEMPLATE))
    resources = template["Resources"]
    for function in HANDLERS | CONSOLE:
        properties = resources[function]["Properties"]
        reserved = properties["ReservedConcurrentExecutions"]
        if function == "MigrateFunction":
            assert reserved == 1, "one migration at a time"
            continue
        parameter = template["Parameters"][reserved["Ref"]]
        assert parameter["Type"] == "Number" and int(parameter["Default"]) >= 1, function
    queue = {"Fn::GetAtt": ["FailedInvocationsQueue", "Arn"]}
    for function in ASYNC_FUNCTIONS:
        dead_letters = resources[function]["Properties"]["DeadLetterQueue"]
        assert dead_letters == {"Type": "SQS", "TargetArn": queue}, function
    queue_properties = resources["FailedInvocationsQueue"]["Properties"]
    assert queue_properties["KmsMasterKeyId"] == WITH_KEY
    assert queue_properties["SqsManagedSseEnabled"] == {
        "Fn::If": ["HasKmsKey", {"Ref": "AWS::NoValue"}, True]
    }
    assert template["Globals"]["Function"]["KmsKeyArn"] == WITH_KEY
    assert template["Conditions"]["HasKmsKey"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "KmsKeyArn"}, ""]}]
    }
    assert template["Parameters"]["KmsKeyArn"]["Default"] == ""


# -- checkov ------------------------------------------------------------------------------------


def find_checkov() -> str:
    """DULY_CHECKOV, else checkov on PATH, else a skip saying so."""
    named = variables.CHECKOV.read()
    if named is not None and not os.access(named, os.X_OK):
        pytest.fail(f"DULY_CHECKOV={named} is not an executable checkov")
    found = named or shutil.which("checkov")
    if found is None:
        pytest.skip("checkov is not installed: set DULY_CHECKOV or put it on PATH (.ci/run does)")
    return found


def checkov_summary(checkov: str, template: Path) -> dict[str, Any]:
    """checkov's CloudFormation checks of `template`, offline; its summary, failures named."""
    done = subprocess.run(
        [checkov, "-f", str(template), "--framework", "cloudformation", "-o", "json",
         "--quiet", "--skip-download"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    report = json.loads(done.stdout)
    failed = [
        f"{check['check_id']} {check['resource']}" for check in report["results"]["failed_checks"]
    ]
    summary: dict[str, Any] = report["summary"]
    assert summary["failed"] == 0 and failed == [], "\n".join(failed)
    return summary


@pytest.mark.timeout(600)
def test_checkov_finds_nothing_and_every_skip_says_why(tmp_path: Path) -> None:
    checkov = find_checkov()
    summary = checkov_summary(checkov, TEMPLATE)
    assert summary["parsing_errors"] == 0 and summary["passed"] > 0, summary
    # checkov leaves out the resources whose condition is false with the defaults: the
    # template again with the console, the endpoints, the key, Aurora and SnapStart on.
    template: dict[str, Any] = load(str(TEMPLATE))
    for parameter, value in (
        ("PublicConsole", "true"),
        ("CreateVpcEndpoints", "true"),
        ("KmsKeyArn", "arn:aws:kms:us-east-1:123456789012:key/duly"),
        ("CreateAuroraDatabase", "true"),
        ("SnapStart", "true"),
    ):
        template["Parameters"][parameter]["Default"] = value
    everything = tmp_path / "everything.json"
    everything.write_text(json.dumps(template))
    all_on = checkov_summary(checkov, everything)
    checked = all_on["passed"] + all_on["skipped"]
    assert checked > summary["passed"] + summary["skipped"], "the conditional ones too"
    skips = [
        (name, skip)
        for name, resource in template["Resources"].items()
        for skip in resource.get("Metadata", {}).get("checkov", {}).get("skip", [])
    ]
    assert skips, "the HTTP functions' dead-letter queue is skipped, and says why"
    for name, skip in skips:
        assert skip["id"].startswith("CKV_") and len(skip.get("comment", "").split()) >= 5, name


# -- a database that rests, and SnapStart ------------------------------------------------------


def test_the_aurora_option_pauses_at_zero_acu_and_refuses_rds_proxy() -> None:
    template: dict[str, Any] = load(str(TEMPLATE))
    parameters, resources = template["Parameters"], template["Resources"]
    make_aurora = {"Fn::Equals": [{"Ref": "CreateAuroraDatabase"}, "true"]}
    assert template["Conditions"]["MakeAurora"] == make_aurora
    assert parameters["CreateAuroraDatabase"]["Default"] == "false", "today's path by default"
    pause = parameters["SecondsUntilAutoPause"]
    assert (int(pause["MinValue"]), int(pause["MaxValue"])) == (300, 86400)
    for name, kind in (
        ("AuroraCluster", "AWS::RDS::DBCluster"),
        ("AuroraInstance", "AWS::RDS::DBInstance"),
        ("AuroraSubnetGroup", "AWS::RDS::DBSubnetGroup"),
        ("AuroraSecurityGroup", "AWS::EC2::SecurityGroup"),
        ("AuroraClientSecurityGroup", "AWS::EC2::SecurityGroup"),
    ):
        assert (resources[name]["Type"], resources[name]["Condition"]) == (kind, "MakeAurora")
    cluster = resources["AuroraCluster"]["Properties"]
    assert cluster["Engine"] == "aurora-postgresql"
    assert cluster["ServerlessV2ScalingConfiguration"]["MinCapacity"] == 0
    assert cluster["ServerlessV2ScalingConfiguration"]["SecondsUntilAutoPause"] == {
        "Ref": "SecondsUntilAutoPause"
    }
    assert cluster["ManageMasterUserPassword"] is True and cluster["StorageEncrypted"] is True
    assert resources["AuroraInstance"]["Properties"]["DBInstanceClass"] == "db.serverless"
    [ingress] = resources["AuroraSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert (ingress["FromPort"], ingress["ToPort"]) == (5432, 5432)
    assert ingress["SourceSecurityGroupId"] == {
        "Fn::GetAtt": ["AuroraClientSecurityGroup", "GroupId"]
    }
    # The functions connect with the cluster's RDS-managed secret, in the clients' group.
    environment = template["Globals"]["Function"]["Environment"]["Variables"]
    secret = {"Fn::GetAtt": ["AuroraCluster", "MasterUserSecret.SecretArn"]}
    assert environment["DULY_DATABASE_SECRET_ARN"]["Fn::If"][:2] == ["MakeAurora", secret]
    pauses = {"Fn::If": ["MakeAurora", "true", {"Ref": "DatabasePauses"}]}
    assert environment["DULY_DATABASE_PAUSES"] == pauses, "its functions rest with it"
    groups = template["Globals"]["Function"]["VpcConfig"]["Fn::If"][1]["SecurityGroupIds"]
    assert groups["Fn::If"][0] == "MakeAurora" and "AuroraClientSecurityGroup" in json.dumps(groups)
    migrations = resources["Migrations"]["Properties"]
    assert migrations["DatabaseInstance"]["Fn::If"][:2] == ["MakeAurora", {"Ref": "AuroraInstance"}]
    # With RDS Proxy the instance never goes without a connection: the deploy is refused.
    rule = template["Rules"]["AutoPauseHasNoProxy"]
    assert rule["RuleCondition"] == make_aurora
    [assertion] = rule["Assertions"]
    assert assertion["Assert"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "CreateDatabaseProxy"}, "true"]}]
    }
    assert "incompatible with auto-pause" in assertion["AssertDescription"]
    vpc_rule = json.dumps(template["Rules"]["AuroraHasAVpc"])
    assert '"VpcId"' in vpc_rule and '"SubnetIds"' in vpc_rule
    named = json.dumps(template["Rules"]["DatabaseIsNamed"])
    assert '{"Fn::Equals": [{"Ref": "CreateAuroraDatabase"}, "true"]}' in named


def test_snapstart_is_an_option_on_every_serving_function_behind_its_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from functions.lambdas import handlers, snapshots

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    template: dict[str, Any] = load(str(TEMPLATE))
    assert template["Conditions"]["UseSnapStart"] == {"Fn::Equals": [{"Ref": "SnapStart"}, "true"]}
    assert template["Globals"]["Function"]["AutoPublishAlias"] == "live"
    assert template["Globals"]["Function"]["VersionDeletionPolicy"] == "Delete", "none pile up"
    on = {"Fn::If": ["UseSnapStart", {"ApplyOn": "PublishedVersions"}, {"Ref": "AWS::NoValue"}]}
    for name in (*SERVING, "ConsoleFunction"):
        assert template["Resources"][name]["Properties"]["SnapStart"] == on, name
    # The schedule and a kick invoke the alias, the version SnapStart snapshots.
    wake_arn = template["Globals"]["Function"]["Environment"]["Variables"]["DULY_WAKE_FUNCTION_ARN"]
    assert wake_arn["Fn::Sub"].endswith("-wake:live")
    # As CloudFormation gets it: each serving function's version and alias, its URL on the alias.
    resources = transformed(SnapStart="true")["Resources"]
    for name in SERVING:
        function = resources[name]["Properties"]
        assert function["SnapStart"] == on, name
        assert resources[f"{name}Aliaslive"]["Type"] == "AWS::Lambda::Alias", name
    url = resources["ApiFunctionUrl"]["Properties"]
    assert url["TargetFunctionArn"] == {"Ref": "ApiFunctionAliaslive"}
    target = resources["WakeFunctionSafetyNet"]["Properties"]["Target"]
    assert target["Arn"] == {"Ref": "WakeFunctionAliaslive"}
    # The entries the functions name register the hooks that close and re-seed.
    from snapshot_restore_py import get_after_restore, get_before_snapshot

    assert handlers.snapshots is snapshots
    assert snapshots.before_snapshot in [hook for hook, _, _ in get_before_snapshot()]
    assert snapshots.after_restore in [hook for hook, _, _ in get_after_restore()]
