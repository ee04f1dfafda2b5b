"""On Lambda, an AWS_IAM Function URL's caller is the request's principal.

- the caller's ARN, and its assumed role's ARN, take roles from DULY_ROLES; a caller no entry
  names holds DULY_DEFAULT_ROLE (viewer): test_an_iam_caller_acts_with_the_roles_its_arn_has
- wrong bearers are counted per Function URL `sourceIp`: a rotated X-Forwarded-For buys no
  more guesses, and a fixed one locks no other address out:
  test_wrong_bearers_are_counted_per_source_ip
- an IAM caller submits a graph subject and, as an admin role, approves on another's behalf;
  the trail names its ARN: test_an_iam_caller_is_the_actor_of_a_graph_move
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from functions.lambdas import handlers as lambda_handlers
from tests.aws_fakes import create_tables, function, function_url_event, settings_for
from tests.conftest import Database

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")

OPS = "arn:aws:iam::123456789012:role/ops"
OPS_SESSION = "arn:aws:sts::123456789012:assumed-role/ops/deploy-7"
READER = "arn:aws:sts::123456789012:assumed-role/dashboards/grafana"
SIGNUP = {"event_type": "user.signed_up", "event_id": "s-iam", "payload": {"email": "i@x.io"}}


async def test_an_iam_caller_acts_with_the_roles_its_arn_has(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_ROLES", json.dumps({f"iam:{OPS}": ["operator"]}))
    await create_tables(db)
    async with function(settings_for(db)) as fn:
        read = await fn.call(
            lambda_handlers.http, function_url_event("GET", "/workflows", caller=READER)
        )
        assert read.get("statusCode") == 200, read
        refused = await fn.call(
            lambda_handlers.http, function_url_event("POST", "/events", SIGNUP, caller=READER)
        )
        assert refused.get("statusCode") == 403, refused
        assert "needs the operator role" in json.loads(refused["body"])["detail"]
        assert READER in json.loads(refused["body"])["detail"]
        stored = await fn.call(
            lambda_handlers.http,
            function_url_event("POST", "/events", SIGNUP, caller=OPS_SESSION),
        )
        assert stored.get("statusCode") == 200, stored
        assert json.loads(stored["body"])["stored"] == ["s-iam"]


async def test_wrong_bearers_are_counted_per_source_ip(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_API_TOKEN", "a-token-of-the-lambda-identity-tests")
    await create_tables(db)

    def guess(n: int, source: str) -> dict[str, Any]:
        event = function_url_event("GET", "/workflows")
        event["headers"]["authorization"] = f"Bearer wrong-{n}"
        event["headers"]["x-forwarded-for"] = "198.51.100.9"  # the same "victim" each time
        event["requestContext"]["http"]["sourceIp"] = source
        return event

    async with function(settings_for(db)) as fn:
        statuses = []
        for n in range(11):
            event = guess(n, "203.0.113.5")
            event["headers"]["x-forwarded-for"] = f"192.0.2.{n}"
            statuses.append((await fn.call(lambda_handlers.http, event)).get("statusCode"))
        assert statuses == [401] * 10 + [429]
        other = await fn.call(lambda_handlers.http, guess(99, "203.0.113.77"))
        assert other.get("statusCode") == 401  # another address still has its own tries


async def test_an_iam_caller_is_the_actor_of_a_graph_move(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the Lambda entry, an assumed role submits an expense claim (the instance says
    its ARN submitted it) and an admin role's session approves on mia's behalf (the trail
    says that ARN acted for mia); the same role, as a plain viewer, may not name mia."""
    from functions import examples
    from functions.expense_graph import DESIGN, EXPENSE_APPROVAL
    from tests.helpers import examples_configured

    monkeypatch.setenv("DULY_ROLES", json.dumps({f"iam:{OPS}": ["admin"]}))
    Session = await db.create(examples.Base.metadata)
    async with Session() as session:
        claim = examples.ExpenseClaim(title="Trip", amount=250, submitted_by="sam")
        session.add(claim)
        await session.commit()
    with examples_configured():
        async with function(settings_for(db, app_module="functions.examples")) as fn:

            async def call(method: str, path: str, caller: str, body: object = None) -> object:
                path, _, query = path.partition("?")
                event = function_url_event(method, path, body, query, caller=caller)
                answer = await fn.call(lambda_handlers.http, event)
                assert answer.get("statusCode") in (200, 201), answer
                return json.loads(answer["body"])

            saved = await call("POST", "/graphs/templates", OPS_SESSION, DESIGN)
            assert isinstance(saved, dict)
            await call("POST", f"/graphs/templates/{saved['template_id']}/activate", OPS_SESSION)
            submit = {
                "subject_type": "expense_claims",
                "subject_key": str(claim.id),
                "workflow": EXPENSE_APPROVAL,
            }
            instance = await call("POST", "/graphs/instances", READER, submit)
            assert isinstance(instance, dict) and instance["submitted_by"] == READER
            iid = instance["id"]
            offered = await call(
                "GET", f"/graphs/instances/{iid}/transitions?user=mia", OPS_SESSION
            )
            assert isinstance(offered, dict)
            [approve] = [t for t in offered["transitions"] if t["display_name"] == "Approve"]
            move = {
                "branch_id": approve["branch_id"],
                "target_id": approve["target_id"],
                "user": "mia",
            }
            forged = function_url_event(
                "POST", f"/graphs/instances/{iid}/transitions", move, caller=READER
            )
            refused = await fn.call(lambda_handlers.http, forged)
            assert refused.get("statusCode") == 403, refused
            moved = await call("POST", f"/graphs/instances/{iid}/transitions", OPS_SESSION, move)
            assert isinstance(moved, dict) and moved["moved"] is True
            trail = await call("GET", f"/graphs/instances/{iid}/history", READER)
            assert isinstance(trail, dict)
            [vote] = [e for e in trail["history"] if e["action_type"] == "approval"]
            assert (vote["actor"], vote["acted_by"]) == ("mia", OPS_SESSION)
            assert vote["done_by"] == f"{OPS_SESSION} on behalf of mia"
