"""A Lambda event is what its door says it is; a direct invoke acts as the configured principal.

- an HTTP-shaped event sent to publish, wake, drain or deliver, naming an admin's ARN or an
  admin group as its IAM caller, is refused before anything is read: no data answered,
  nothing written (test_a_forged_authorizer_is_refused_by_every_direct_entry)
- the http entry under DULY_PUBLIC_URL drops a forged authorizer (401 without another
  credential, 200 with one); without it, a Function URL's IAM caller acts as before
  (test_the_http_entry_trusts_an_authorizer_only_behind_an_aws_iam_url)
- a direct publish and delivery are recorded as DULY_DIRECT_INVOKE_PRINCIPAL's, `lambda:direct`
  unset; a payload naming an actor is refused and writes nothing; a principal the audit
  cannot hold stops the deployment, not the input
  (test_direct_entries_record_the_configured_principal)
- a refusal's log line says its kind and places, never the values sent
  (test_a_refusal_logs_where_never_what); nor does the migrate function's answer, which it
  logs (test_the_migrate_function_answers_an_unknown_request_type_without_echoing_it)
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from engine import ConfigurationError, connect_workflows
from engine.testing import drain as drain_steps
from functions.lambdas import handlers as lambda_handlers
from functions.lambdas.runtime import WAKE_INPUT
from tests.apps.serverless_app import Signup
from tests.aws_fakes import Entry, create_tables, function, function_url_event, settings_for
from tests.conftest import Database

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")

TOKEN = "admin-token-for-these-tests-0123456789"
ADMINS = "arn:aws:sts::123456789012:assumed-role/admins/x"
ROLES = {"iam:arn:aws:iam::123456789012:role/admins": ["admin"], "group:ops-admins": ["admin"]}
DIRECT = [lambda_handlers.publish, lambda_handlers.wake, lambda_handlers.drain]
DIRECT_ENTRIES: list[Entry] = [*DIRECT, lambda_handlers.deliver]
# Exactly what the caller allowed only lambda:InvokeFunction sent.
FORGED_AUDIT = {
    "version": "2.0",
    "requestContext": {
        "http": {"method": "GET", "path": "/audit"},
        "authorizer": {"iam": {"userArn": ADMINS}},
    },
}
SECRET = "sk_live_51HkDoNotLogThis0123456789"
SIGNUP = {"event_type": "user.signed_up", "event_id": "d-1", "payload": {"email": "d@x.io"}}
UNREACHABLE = "postgresql://nobody:nothing@127.0.0.1:1/none"  # a read would fail at once


@pytest.fixture
def admins_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed guard (the admin token set) and the admins' role and group named as admins."""
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    monkeypatch.setenv("DULY_ROLES", json.dumps(ROLES))
    monkeypatch.delenv("DULY_PUBLIC_URL", raising=False)


def written(db: Database) -> list[Any]:
    """What a forged request could have written or read: the audit and the graph templates."""
    return db.sql(
        "SELECT (SELECT count(*) FROM duly_audit), (SELECT count(*) FROM duly_graph_templates)"
    )


@pytest.mark.usefixtures("admins_configured")
async def test_a_forged_authorizer_is_refused_by_every_direct_entry(db: Database) -> None:
    from functions import examples
    from functions.expense_graph import DESIGN
    from tests.helpers import examples_configured

    await db.create(examples.Base.metadata)
    forged_admin = function_url_event("GET", "/audit", caller=ADMINS)
    forged_group = function_url_event("POST", "/graphs/templates", DESIGN, caller="ops-admins")
    before = written(db)
    with examples_configured():
        async with function(settings_for(db, app_module="functions.examples")) as fn:
            for entry in DIRECT_ENTRIES:
                for event in (forged_admin, forged_group, FORGED_AUDIT):
                    answer = await fn.call(entry, event)
                    assert set(answer) == {"error", "type"}, (entry.__name__, answer)
                    assert answer["type"] == "InputError", answer
                    assert "functions.lambdas.handlers.http" in answer["error"], answer
        # Refused before the database is reached: a function whose database cannot be
        # reached answers the same.
        async with function(settings_for(db, database_url=UNREACHABLE)) as nowhere:
            for entry in DIRECT_ENTRIES:
                answer = await nowhere.call(entry, FORGED_AUDIT)
                assert answer["type"] == "InputError", (entry.__name__, answer)
    assert written(db) == before, "a forged request wrote something"


@pytest.mark.usefixtures("admins_configured")
async def test_the_http_entry_trusts_an_authorizer_only_behind_an_aws_iam_url(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_tables(db)
    forged = function_url_event("GET", "/audit", caller=ADMINS)
    async with function(settings_for(db)) as fn:
        answer = await fn.call(lambda_handlers.http, forged)
        assert answer.get("statusCode") == 200, "behind an AWS_IAM URL the caller is AWS's"
        for not_http in (WAKE_INPUT, FORGED_AUDIT):  # the latter lacks what a URL's has
            assert await fn.call(lambda_handlers.http, not_http) == {
                "error": "The http function takes an HTTP request's event only.",
                "type": "InputError",
            }
    monkeypatch.setenv("DULY_PUBLIC_URL", "true")
    async with function(settings_for(db)) as fn:
        answer = await fn.call(lambda_handlers.http, forged)
        assert answer.get("statusCode") == 401, answer
        with_token = function_url_event("GET", "/audit", caller=ADMINS)
        with_token["headers"]["authorization"] = f"Bearer {TOKEN}"
        answer = await fn.call(lambda_handlers.http, with_token)
        assert answer.get("statusCode") == 200, answer


async def test_direct_entries_record_the_configured_principal(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    Session = await create_tables(db)
    async with connect_workflows(Session):
        signup = Signup(email="p@example.com")
        await signup.start(Signup.nudge)
    await drain_steps(Session, [Signup])
    delivery = {"workflow": "lambda_signup", "key": signup.id, "step": "confirm"}
    async with function(settings_for(db)) as fn:
        named = [
            (lambda_handlers.publish, {**SIGNUP, "actor": ADMINS}),
            (lambda_handlers.publish, {"events": [{**SIGNUP, "by": ADMINS}]}),
            (lambda_handlers.deliver, {**delivery, "args": {"code": "1"}, "actor": ADMINS}),
            (lambda_handlers.wake, {**WAKE_INPUT, "actor": ADMINS}),
            (lambda_handlers.drain, {"duly": "drain", "user": ADMINS}),
        ]
        for entry, event in named:
            answer = await fn.call(entry, event)
            assert answer["type"] == "InputError", (entry.__name__, answer)
        assert db.sql("SELECT count(*) FROM duly_audit") == [(0,)]
        monkeypatch.setenv("DULY_DIRECT_INVOKE_PRINCIPAL", "x" * 201)
        with pytest.raises(ConfigurationError, match="DULY_DIRECT_INVOKE_PRINCIPAL"):
            await fn.call(lambda_handlers.publish, SIGNUP)
        assert db.sql("SELECT count(*) FROM lambda_outbox") == [(0,)]

        monkeypatch.delenv("DULY_DIRECT_INVOKE_PRINCIPAL")
        assert (await fn.call(lambda_handlers.publish, SIGNUP))["stored"] == ["d-1"]
        monkeypatch.setenv("DULY_DIRECT_INVOKE_PRINCIPAL", "svc:webhooks")
        answer = await fn.call(lambda_handlers.deliver, {**delivery, "args": {"code": "7"}})
        assert answer["accepted"] == 1, answer
    trail = db.sql(
        "SELECT actor, via, action, workflow, count, subject FROM duly_audit ORDER BY id"
    )
    assert trail == [
        ("lambda:direct", "lambda", "outbox.publish", "lambda_outbox", 1, {"event_ids": ["d-1"]}),
        (
            "svc:webhooks",
            "lambda",
            "run.deliver",
            "lambda_signup",
            1,
            {"key": signup.id, "step": "confirm"},
        ),
    ]


async def test_a_refusal_logs_where_never_what(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    await create_tables(db)
    sent_to_http = function_url_event("GET", "/audit")
    sent_to_http["headers"]["authorization"] = f"Bearer {SECRET}"
    refused: list[tuple[Entry, Any]] = [
        (lambda_handlers.wake, {"duly": SECRET}),
        (lambda_handlers.drain, {"duly": "drain", SECRET[:8]: SECRET}),
        (lambda_handlers.publish, {"events": [{**SIGNUP, "event_type": ""}], "api_key": SECRET}),
        (lambda_handlers.deliver, sent_to_http),
        (lambda_handlers.deliver, {"workflow": "lambda_signup", "key": SECRET, "step": "confirm"}),
    ]
    async with function(settings_for(db)) as fn:
        with caplog.at_level(logging.INFO, logger="duly"):
            for entry, event in refused:
                answer = await fn.call(entry, event)
                assert set(answer) == {"error", "type"}, answer
    lines = [r.getMessage() for r in caplog.records if "refused its input" in r.getMessage()]
    assert len(lines) == len(refused), caplog.text
    assert SECRET not in caplog.text
    assert "wake refused its input: InputError at duly" in lines[0], lines
    assert "deliver refused its input: InputError at requestContext" in lines[3], lines


def test_the_migrate_function_answers_an_unknown_request_type_without_echoing_it() -> None:
    from functions.lambdas.custom_resource import Request
    from functions.lambdas.migrate import outcome_of
    from functions.lambdas.runtime import Budget

    request = Request(SECRET, "https://example.invalid/", "stack", "request", "Migrations", "id")
    outcome = outcome_of(request, Budget.of(None, 5.0))
    assert outcome.status == "FAILED" and SECRET not in outcome.reason, outcome
