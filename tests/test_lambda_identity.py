"""On Lambda, an AWS_IAM Function URL's caller is the request's principal.

- the caller's ARN, and its assumed role's ARN, take roles from DULY_ROLES; a caller no entry
  names holds DULY_DEFAULT_ROLE (viewer): test_an_iam_caller_acts_with_the_roles_its_arn_has
"""

from __future__ import annotations

import json

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
    monkeypatch.setenv("DULY_ROLES", json.dumps({OPS: ["operator"]}))
    await create_tables(db)
    async with function(settings_for(db)) as fn:
        read = await fn.call(
            lambda_handlers.publish, function_url_event("GET", "/workflows", caller=READER)
        )
        assert read.get("statusCode") == 200, read
        refused = await fn.call(
            lambda_handlers.publish, function_url_event("POST", "/events", SIGNUP, caller=READER)
        )
        assert refused.get("statusCode") == 403, refused
        assert "needs the operator role" in json.loads(refused["body"])["detail"]
        assert READER in json.loads(refused["body"])["detail"]
        stored = await fn.call(
            lambda_handlers.publish,
            function_url_event("POST", "/events", SIGNUP, caller=OPS_SESSION),
        )
        assert stored.get("statusCode") == 200, stored
        assert json.loads(stored["body"])["stored"] == ["s-iam"]
