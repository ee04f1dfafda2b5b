"""The console function's public Function URL (functions/lambdas/public_url.py).

Behind a Function URL of auth type NONE nobody has checked the caller, so with
no credential configured the app would serve everyone as the admin:

- marked DULY_PUBLIC_URL with no credential, the entry refuses to serve at all
  (a ConfigurationError: the URL answers 502), and writes nothing
  (test_a_public_url_with_no_credential_serves_nothing)
- with an API key configured, a request without it is 401 and with it is served
  (test_a_public_url_with_a_key_asks_for_it)
- unmarked (the AWS_IAM URL, duly dev), nothing changes
  (test_an_unmarked_function_serves_as_before)
"""

from __future__ import annotations

import json

import pytest

from engine import ConfigurationError
from functions.identity.keys import digest_of, new_key
from functions.lambdas import handlers as lambda_handlers
from tests.aws_fakes import create_tables, function, function_url_event, settings_for
from tests.conftest import Database

pytestmark = pytest.mark.usefixtures("fresh_lambda_runtime")

KEY = new_key()
SIGNUP = {"event_type": "user.signed_up", "event_id": "s-pub", "payload": {"email": "p@x.io"}}


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """No credential variable set, whatever the shell running the tests has."""
    for name in (
        "DULY_API_TOKEN",
        "DULY_API_KEYS",
        "DULY_METRICS_TOKEN",
        "DULY_OIDC_ISSUER",
        "DULY_WEBHOOK_SECRET",
        "DULY_WEBHOOK_SECRETS",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_credentials")
async def test_a_public_url_with_no_credential_serves_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_PUBLIC_URL", "true")
    await create_tables(db)
    async with function(settings_for(db)) as fn:
        with pytest.raises(ConfigurationError, match="each of them would act as the admin"):
            await fn.call(lambda_handlers.http, function_url_event("POST", "/events", SIGNUP))
    assert db.sql("SELECT count(*) FROM lambda_outbox") == [(0,)]


@pytest.mark.usefixtures("no_credentials")
async def test_a_public_url_with_a_key_asks_for_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_PUBLIC_URL", "true")
    entry = {"name": "console", "roles": ["operator"], "sha256": digest_of(KEY)}
    monkeypatch.setenv("DULY_API_KEYS", json.dumps([entry]))
    await create_tables(db)
    async with function(settings_for(db)) as fn:
        refused = await fn.call(lambda_handlers.http, function_url_event("POST", "/events", SIGNUP))
        assert refused["statusCode"] == 401, refused
        signed_in = function_url_event("POST", "/events", SIGNUP)
        signed_in["headers"]["authorization"] = f"Bearer {KEY}"
        stored = await fn.call(lambda_handlers.http, signed_in)
        assert stored["statusCode"] == 200, stored
        assert json.loads(stored["body"])["stored"] == ["s-pub"]


@pytest.mark.usefixtures("no_credentials")
async def test_an_unmarked_function_serves_as_before(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DULY_PUBLIC_URL", raising=False)
    await create_tables(db)
    async with function(settings_for(db)) as fn:
        answer = await fn.call(lambda_handlers.http, function_url_event("GET", "/workflows"))
        assert answer["statusCode"] == 200, answer
