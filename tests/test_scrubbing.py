"""Secrets out of kept text (engine/base/scrubbing.py) and a long traceback's cut (failures).

- every secret setting's value is masked, the database URLs' passwords (as written and
  decoded) and each DULY_WEBHOOK_SECRETS entry's too; settings that are not secret are
  left as they are: test_configured_secrets_are_masked
- a password in any URL and an API key duly issued are masked, whatever is configured;
  a value too short to be a secret masks nothing: test_url_passwords_and_api_keys_are_masked
- text past the bound keeps its head and tail around a marked cut, in whole characters:
  test_a_long_text_keeps_its_head_and_tail
"""

from __future__ import annotations

import json

from engine.base.scrubbing import MASK, scrub_secrets
from engine.worker.failures import TRACEBACK_HEAD, bounded_text
from functions.identity.keys import new_key

ENVIRON = {
    "DULY_API_TOKEN": "api-token-0123456789",
    "DULY_METRICS_TOKEN": "metrics-token-0123456789",
    "DULY_WEBHOOK_SECRET": "webhook-secret-0123456789",
    "DULY_WEBHOOK_SECRETS": json.dumps(
        [{"name": "github", "secret": "listed-secret-0123456789", "routes": ["POST /x"]}]
    ),
    "DULY_OIDC_CLIENT_SECRET": "oidc-client-secret-0123",
    "DULY_DATABASE_URL": "postgresql://app:p%40ss-w0rd@db.internal:5432/app",
    "DULY_TEST_DATABASE_URL": "postgresql://tests:test-pass-99@localhost/postgres",
    "DULY_APP": "functions.examples",  # not a secret
}


def test_configured_secrets_are_masked() -> None:
    text = (
        "api-token-0123456789 metrics-token-0123456789 webhook-secret-0123456789 "
        "listed-secret-0123456789 oidc-client-secret-0123 p@ss-w0rd p%40ss-w0rd test-pass-99 "
        "functions.examples"
    )
    assert scrub_secrets(text, ENVIRON) == " ".join([MASK] * 8 + ["functions.examples"])
    # The whole URL as configured, not just its password.
    assert scrub_secrets(f"dsn={ENVIRON['DULY_DATABASE_URL']}!", ENVIRON) == "dsn=***!"
    assert scrub_secrets("nothing secret", {}) == "nothing secret"
    assert scrub_secrets("a secret given too: hush-hush", {}, also=["hush-hush"]) == (
        "a secret given too: ***"
    )


def test_url_passwords_and_api_keys_are_masked() -> None:
    text = "redis://:hunter2@cache:6379/0 and https://user:pa:ss@host/path?q=1 and http://host/"
    assert scrub_secrets(text, {}) == (
        "redis://:***@cache:6379/0 and https://user:***@host/path?q=1 and http://host/"
    )
    key = new_key()
    assert scrub_secrets(f"Authorization: Bearer {key}.", {}) == "Authorization: Bearer ***."
    assert scrub_secrets("duly_dev and abc", {"DULY_API_TOKEN": "abc"}) == "duly_dev and abc"


def test_a_long_text_keeps_its_head_and_tail() -> None:
    assert bounded_text("short", 8192) == "short"
    text = "HEAD" + "é" * 10_000 + "TAIL: the exception line"
    bounded = bounded_text(text, 8192)
    assert len(bounded.encode()) <= 8192
    head, marker, tail = bounded.partition("\n[… ")
    assert head.startswith("HEAD") and len(head.encode()) <= TRACEBACK_HEAD
    assert tail.endswith("TAIL: the exception line")
    cut = int(marker and tail.split(" bytes cut …]\n")[0])
    assert len(head.encode()) + cut + len(tail.split("]\n", 1)[1].encode()) == len(text.encode())
