"""The HTTP API fuzzed from its own OpenAPI schema, and its guards on writes.

Schemathesis generates requests for every operation of the served app's
schema (each workflow's start, deliver and run bodies included, with the
arguments its steps take) and sends them, with a valid token, to the real
app under uvicorn on a real database: whatever it sends, no answer is a
server error, nor a status, content type or body the operation does not document,
and the schema offers no table of the engine's own.
The guards are checked one by one: a write without a token or with a bad or
stale signature is 401, a body over the limit 413 before it is read whole.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    allow_header_conformance,
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import Failure, FailureGroup
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.model.registry import registered_workflows
from functions import examples
from functions.app import create_app
from functions.identity.signatures import signature_of
from tests.apps import api
from tests.conftest import Database
from tests.helpers import serving

TOKEN = "fuzz-token-of-the-api"
SECRET = "fuzz-secret-of-the-webhook"
EXAMPLES_PER_OPERATION = 6  # about 50 operations: a few hundred requests, well under 60 s
START = {"row": {"number": "Z-1", "total": 1}, "step": "chase"}
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    return await db.create(examples.Base.metadata, api.Base.metadata)


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes need the token or a signature; bodies up to 4 KiB."""
    monkeypatch.setenv("DULY_API_TOKEN", TOKEN)
    monkeypatch.setenv("DULY_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("DULY_MAX_BODY_BYTES", "4096")


@pytest.fixture
async def client(
    Session: async_sessionmaker[AsyncSession], guarded: None
) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(create_app(Session, run_worker=False)) as client:
        yield client


def fuzz(raw_schema: dict[str, Any], base_url: str) -> tuple[list[str], Counter[int], set[str]]:
    """Send valid and invalid generated requests, with the token, for every operation.

    Each answer is checked by schemathesis: not a server error (a 503 only where the
    operation documents one), a status, content type, body and Allow the operation
    documents. Returns each
    failure (as `METHOD path: status, why`), how often each status came back, and
    the operations sent.
    """
    schema = schemathesis.openapi.from_dict(raw_schema)
    session = requests.Session()
    session.trust_env = False  # no proxy between the test and the loopback port
    headers = {"Authorization": f"Bearer {TOKEN}"}
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    sent: set[str] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        cases = st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),
        )

        @given(case=cases)
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=30)
            statuses[response.status_code] += 1
            sent.add(f"{case.method} {case.path}")
            checks = [
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
                allow_header_conformance,
            ]
            documented = {str(status) for status in case.operation.responses.status_codes}
            # 503 is an answer of its own: /wake without a worker, /drain without a drain.
            if not (response.status_code == 503 and "503" in documented):
                checks.append(not_a_server_error)
            try:
                case.validate_response(response, checks=checks, headers=headers)
            except (Failure, FailureGroup) as exc:
                why = " ".join(str(exc).split())[:300]
                where = f"{case.method} {case.formatted_path}"
                failures.append(f"{where}: {response.status_code}, {why}")

        check()
    return failures, statuses, sent


async def test_no_generated_request_is_a_server_error_or_undocumented(
    client: httpx.AsyncClient,
) -> None:
    raw = (await client.get("/openapi.json", headers=BEARER)).json()
    assert "/workflows/invoice/deliver" in raw["paths"]
    # No table of the engine's own (the outbox, graph timers) is offered as a workflow.
    internal = {info.name for info in registered_workflows() if info.engine_owned}
    assert {"duly_outbox", "duly_graph_timers"} <= internal
    assert [path for path in raw["paths"] if set(path.split("/")) & internal] == []
    operations = {f"{m.upper()} {p}" for p, ops in raw["paths"].items() for m in ops}
    started = time.monotonic()
    # The fuzzer is synchronous: it runs in a thread while this loop serves the app.
    failures, statuses, sent = await asyncio.to_thread(fuzz, raw, str(client.base_url))
    assert failures == []
    assert sent == operations  # every operation of the schema, none left out
    # The fuzzer got past validation too: runs started, bodies refused, unknown names.
    assert statuses[200] and statuses[201] and statuses[404] and statuses[422], statuses
    assert time.monotonic() - started < 90


async def test_requests_without_a_good_token_are_401_and_guessing_is_slowed(
    client: httpx.AsyncClient,
) -> None:
    """No credential, a wrong one, a token without its scheme: 401 with the reason, reads
    included. After ten wrong tokens from one address, it waits (429), good token or not."""
    good = {"Authorization": f"Bearer {TOKEN}"}
    ok = await client.post("/workflows/invoice/start", json=START, headers=good)
    assert ok.status_code == 201, ok.text
    for url, body in (
        ("/workflows/invoice/start", START),
        ("/events", {"event_type": "x.y"}),
        ("/wake", None),
        ("/drain", None),
        ("/outbox/dead-letters/replay", {}),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            reply = await client.post(url, json=body, headers=headers)
            assert reply.status_code == 401, (url, headers, reply.text)
            assert reply.json()["detail"], reply.text  # why, in a sentence
            assert reply.headers["www-authenticate"] == "Bearer"
    assert (await client.get("/workflows/invoice/runs")).status_code == 401  # reads too
    for headers in ({"Authorization": "Bearer wrong"}, good):
        slowed = await client.get("/workflows/invoice/runs", headers=headers)
        assert slowed.status_code == 429, slowed.text
        assert 1 <= int(slowed.headers["retry-after"]) <= 60


def signed(body: bytes, at: float | None = None, secret: str = SECRET) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    return {
        "X-Duly-Timestamp": timestamp,
        "X-Duly-Signature": signature_of(
            secret, timestamp, "POST", "/workflows/invoice/start", "", body
        ),
        "Content-Type": "application/json",
    }


async def test_a_good_signature_is_taken_and_a_bad_or_stale_one_is_401(
    client: httpx.AsyncClient,
) -> None:
    body = json.dumps(START).encode()
    refused = {
        "other secret": signed(body, secret="guess"),
        "stale": signed(body, at=time.time() - 310),  # whole seconds: clear of the edge
        "from the future": signed(body, at=time.time() + 310),
        "not a time": {**signed(body), "X-Duly-Timestamp": "yesterday"},
        # str.isdigit() takes a superscript two; int() refuses it (this was a 500).
        "not ASCII digits": {
            **signed(body),
            "X-Duly-Timestamp": b"\xb2",  # "²" as the server reads it (latin-1)
        },
        "other body": signed(body.replace(b"Z-1", b"Z-2")),
        "no prefix": {**signed(body), "X-Duly-Signature": signed(body)["X-Duly-Signature"][7:]},
        "no timestamp": {k: v for k, v in signed(body).items() if k != "X-Duly-Timestamp"},
    }
    for name, headers in refused.items():
        reply = await client.post("/workflows/invoice/start", content=body, headers=headers)
        assert reply.status_code == 401, (name, reply.text)
        assert reply.json()["detail"], name
    reply = await client.post("/workflows/invoice/start", content=body, headers=signed(body))
    assert reply.status_code == 201, reply.text


async def test_an_oversized_body_is_413_before_it_is_read_whole(
    client: httpx.AsyncClient,
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    big = {**START, "row": {**START["row"], "note": "x" * 5000}}
    declared = await client.post("/workflows/invoice/start", json=big, headers=auth)
    assert declared.status_code == 413
    assert "DULY_MAX_BODY_BYTES" in declared.json()["detail"]
    unauthenticated = await client.post("/events", json=big)
    assert unauthenticated.status_code in (401, 413)

    async def streamed() -> AsyncIterator[bytes]:  # chunked: no Content-Length to judge by
        for _ in range(10):
            yield b" " * 1024

    reply = await client.post("/events", content=streamed(), headers=auth)
    assert reply.status_code == 413
    assert (await client.get("/healthz")).status_code == 200


async def test_unknown_workflows_and_steps_are_404_with_a_message(
    client: httpx.AsyncClient,
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    nope = await client.post("/workflows/nope/run", json={"key": 1, "step": "x"}, headers=auth)
    assert nope.status_code == 404
    assert nope.json()["detail"].startswith("No workflow named 'nope'. This app maps: ")
    assert "invoice" in nope.json()["detail"].split(": ")[1]
    step = await client.post(
        "/workflows/invoice/start", json={**START, "step": "refund"}, headers=auth
    )
    assert step.status_code == 404
    assert "Workflow invoice has no step 'refund'" in step.json()["detail"]
    outbox = await client.post("/workflows/duly_outbox/cancel", json={"key": 1}, headers=auth)
    assert outbox.status_code == 404 and "POST /events" in outbox.json()["detail"]


def test_a_bad_body_limit_is_refused_at_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DULY_MAX_BODY_BYTES", "lots")
    with pytest.raises(ValueError, match="DULY_MAX_BODY_BYTES"):
        create_app(async_sessionmaker(), run_worker=False)
