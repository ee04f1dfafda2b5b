"""Signed requests (functions.identity.signatures): the whole request signed, held to routes, once.

- the signature covers the method, path, query and body: a signed cancel of one
  workflow's run sent to another's cancels nothing
  (test_a_signed_cancel_sent_to_another_workflow_is_401_and_cancels_nothing); a signed
  empty-body wake replayed on other routes is 401
  (test_a_signed_empty_body_replayed_on_another_route_is_401); a changed query is 401
  (test_a_changed_query_string_is_401);
- a signature is taken once, even twice at the same instant, and within 5 minutes of
  the database's clock (test_the_same_signed_request_twice_stores_one_event,
  test_two_copies_at_once_are_taken_once, test_the_window_follows_the_database_clock);
- a secret held to routes is 403 elsewhere and 2xx on its own; the principal is an
  operator named after the secret (test_a_scoped_secret_is_403_on_another_route);
- seen signatures are pruned once expired, by `duly prune` and on the way of each record
  (test_expired_seen_signatures_are_pruned);
- a bad DULY_WEBHOOK_SECRETS stops the app at start, naming the entry and never the
  secret (test_bad_scoped_secrets_are_refused_at_start_without_showing_them).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import (
    ConfigurationError,
    RetentionSettings,
    Workflow,
    connect_workflows,
    declare_engine_tables,
    prune,
    step as workflow_step,
)
from engine.base.seen_signatures import record_signature
from engine.model.connection import open_connection
from functions.app import create_app
from functions.identity.principal import Role, Via
from functions.identity.signatures import Signers, SigningSecret, signature_of
from tests.conftest import Database
from tests.helpers import serving

SECRET = "the-shared-webhook-secret"
REFUNDS_SECRET = "the-refund-senders-own-secret"
SCOPED = [{"name": "refunds", "secret": REFUNDS_SECRET, "routes": ["POST /workflows/refund/*"]}]


class Base(DeclarativeBase):
    """The signed requests' tables."""


class Refund(Base, Workflow):
    """Opened, then waits to be settled."""

    __tablename__ = "refund"
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")

    @workflow_step
    async def settle(self) -> None:
        self.status = "settled"


class Chargeback(Base, Workflow):
    """A second workflow whose runs share the refunds' keys."""

    __tablename__ = "chargeback"
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")

    @workflow_step
    async def settle(self) -> None:
        self.status = "settled"


declare_engine_tables(Base, prefix="signed_")


def signed(
    method: str, path: str, body: bytes = b"", *, query: str = "", secret: str = SECRET,
    at: float | None = None,
) -> dict[str, str]:  # fmt: skip
    """The headers of a request signed at `at` (now by default)."""
    timestamp = str(int(time.time() if at is None else at))
    return {
        "X-Duly-Timestamp": timestamp,
        "X-Duly-Signature": signature_of(secret, timestamp, method, path, query, body),
        "Content-Type": "application/json",
    }


@pytest.fixture
async def Session(db: Database) -> async_sessionmaker[AsyncSession]:
    Session = await db.create(Base.metadata)
    async with connect_workflows(Session):  # run 9001 of each; no worker here runs them
        await Refund(id=9001).start(Refund.settle)
        await Chargeback(id=9001).start(Chargeback.settle)
    return Session


@pytest.fixture
async def client(
    Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("DULY_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("DULY_WEBHOOK_SECRETS", json.dumps(SCOPED))
    async with serving(create_app(Session, run_worker=False)) as client:
        yield client


def live(db: Database, table: str) -> bool:
    [(step,)] = db.sql(f"SELECT next_step FROM {table} WHERE id = 9001")
    return step is not None


def test_the_signature_is_an_hmac_of_timestamp_method_path_query_and_body() -> None:
    expected = hmac.new(
        b"k" * 16, b"1700000000\nPOST\n/wake\ntimeout=1\n{}", hashlib.sha256
    ).hexdigest()
    made = signature_of("k" * 16, "1700000000", "post", "/wake", "timeout=1", b"{}")
    assert made == f"sha256={expected}"


async def test_a_signed_cancel_sent_to_another_workflow_is_401_and_cancels_nothing(
    client: httpx.AsyncClient, db: Database
) -> None:
    body = b'{"key": 9001}'
    headers = signed("POST", "/workflows/refund/cancel", body)
    moved = await client.post("/workflows/chargeback/cancel", content=body, headers=headers)
    assert moved.status_code == 401, moved.text
    assert "does not match this request" in moved.json()["detail"]
    assert live(db, "chargeback") and live(db, "refund")
    own = await client.post("/workflows/refund/cancel", content=body, headers=headers)
    assert own.status_code == 200, own.text
    assert own.json() == {"workflow": "refund", "cancelled": 1}
    assert live(db, "chargeback") and not live(db, "refund")


async def test_a_signed_empty_body_replayed_on_another_route_is_401(
    client: httpx.AsyncClient,
) -> None:
    headers = signed("POST", "/wake")
    for path in ("/outbox/dead-letters/replay", f"/graphs/templates/{uuid.uuid4()}/activate"):
        reply = await client.post(path, headers=headers)
        assert reply.status_code == 401, (path, reply.text)
        assert "does not match this request" in reply.json()["detail"]
    wake = await client.post("/wake", headers=headers)  # on its own route it is taken
    assert wake.status_code == 503, wake.text  # no worker here: not caught up
    assert "signature" not in wake.text


async def test_a_changed_query_string_is_401(client: httpx.AsyncClient) -> None:
    headers = signed("POST", "/wake", query="timeout=0")
    changed = await client.post("/wake?timeout=5", headers=headers)
    assert changed.status_code == 401, changed.text
    dropped = await client.post("/wake", headers=headers)
    assert dropped.status_code == 401, dropped.text
    own = await client.post("/wake?timeout=0", headers=headers)
    assert own.status_code == 503, own.text


async def test_the_same_signed_request_twice_stores_one_event(
    client: httpx.AsyncClient, db: Database
) -> None:
    body = b'{"event_type": "refund.asked"}'
    headers = signed("POST", "/events", body)
    first = await client.post("/events", content=body, headers=headers)
    assert first.status_code == 200, first.text
    assert len(first.json()["stored"]) == 1
    again = await client.post("/events", content=body, headers=headers)
    assert again.status_code == 401, again.text
    assert "taken before" in again.json()["detail"]
    assert db.sql("SELECT count(*) FROM signed_outbox") == [(1,)]


async def test_two_copies_at_once_are_taken_once(client: httpx.AsyncClient, db: Database) -> None:
    body = b'{"event_type": "refund.asked"}'
    headers = signed("POST", "/events", body)
    replies = await asyncio.gather(
        *(client.post("/events", content=body, headers=headers) for _ in range(4))
    )
    assert sorted(reply.status_code for reply in replies) == [200, 401, 401, 401]
    assert db.sql("SELECT count(*) FROM signed_outbox") == [(1,)]


async def test_the_window_follows_the_database_clock(
    client: httpx.AsyncClient, db: Database
) -> None:
    db.sql("INSERT INTO duly_clock (id, shift) VALUES (1, interval '6 minutes')")
    body = b'{"event_type": "refund.asked"}'
    now = await client.post("/events", content=body, headers=signed("POST", "/events", body))
    assert now.status_code == 401, now.text
    assert "more than 5 minutes from now" in now.json()["detail"]
    ahead = signed("POST", "/events", body, at=time.time() + 360)
    assert (await client.post("/events", content=body, headers=ahead)).status_code == 200
    assert db.sql("SELECT count(*) FROM duly_seen_signatures") == [(1,)]


async def test_a_scoped_secret_is_403_on_another_route(
    client: httpx.AsyncClient, db: Database
) -> None:
    body = b'{"key": 9001, "step": "settle"}'
    elsewhere = "/workflows/chargeback/run"
    held = signed("POST", elsewhere, body, secret=REFUNDS_SECRET)
    refused = await client.post(elsewhere, content=body, headers=held)
    assert refused.status_code == 403, refused.text
    assert "signed:refunds's credential is held to other routes" in refused.json()["detail"]
    assert live(db, "chargeback")
    own = "/workflows/refund/run"
    taken = await client.post(
        own, content=body, headers=signed("POST", own, body, secret=REFUNDS_SECRET)
    )
    assert taken.status_code == 200, taken.text
    assert taken.json() == {"workflow": "refund", "addressed": 1}
    # The shared secret is held to nothing.
    shared = await client.post(elsewhere, content=body, headers=signed("POST", elsewhere, body))
    assert shared.status_code == 200, shared.text


def test_a_signer_is_an_operator_named_after_its_secret() -> None:
    signers = Signers.from_env(
        {"DULY_WEBHOOK_SECRET": SECRET, "DULY_WEBHOOK_SECRETS": json.dumps(SCOPED)}
    )
    assert [s.name for s in signers.secrets] == ["webhook", "refunds"]
    shared, scoped = (s.principal() for s in signers.secrets)
    assert (shared.id, shared.via, shared.routes) == ("signed:webhook", Via.SIGNATURE, None)
    assert scoped.routes == frozenset({"POST /workflows/refund/*"})
    assert scoped.has(Role.OPERATOR) and not scoped.has(Role.DESIGNER)
    assert REFUNDS_SECRET not in repr(signers)


async def test_expired_seen_signatures_are_pruned(
    Session: async_sessionmaker[AsyncSession], db: Database
) -> None:
    for n, expires in enumerate(("now() - interval '1 hour'", "now() - interval '1 second'",
                                 "now() + interval '4 minutes'")):  # fmt: skip
        db.sql(f"INSERT INTO duly_seen_signatures VALUES (%s, {expires})", bytes([n]) * 32)
    connection = await open_connection(Session)
    done = await prune(connection, RetentionSettings())
    assert {t.table: t.rows for t in done.tables}["duly_seen_signatures"] == 2
    assert db.sql("SELECT digest FROM duly_seen_signatures") == [(bytes([2]) * 32,)]

    # Each record deletes a few expired rows on its way too.
    db.sql("INSERT INTO duly_seen_signatures VALUES (%s, now() - interval '1 minute')",
           b"\x09" * 32)  # fmt: skip
    recorded = await record_signature(db.engine(), b"\x0a" * 32, int(time.time()), 300)
    assert (recorded.in_window, recorded.first, recorded.pruned) == (True, True, 1)
    assert sorted(d for (d,) in db.sql("SELECT digest FROM duly_seen_signatures")) == [
        bytes([2]) * 32,
        b"\x0a" * 32,
    ]


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("[{", "must be a JSON list"),
        ('{"name": "x"}', "must be a JSON list"),
        (json.dumps([{"name": "refunds", "secret": "short-secret", "routes": ["POST /events"]}]),
         r"DULY_WEBHOOK_SECRETS\[0\] \(refunds\)\.secret must be at least 16"),
        (json.dumps([{**SCOPED[0], "routes": ["/events"]}]),
         r"DULY_WEBHOOK_SECRETS\[0\] \(refunds\)\.routes: '/events' is not"),
        (json.dumps([{**SCOPED[0], "routes": []}]), r"routes must list the routes"),
        (json.dumps([{**SCOPED[0], "roles": ["admin"]}]), r"\[0\] must be an object"),
        (json.dumps([SCOPED[0], {**SCOPED[0], "secret": REFUNDS_SECRET + "-2"}]),
         "Two signing secrets are named 'refunds'"),
        (json.dumps([{**SCOPED[0], "name": "webhook"}]), "Two signing secrets are named"),
        (json.dumps([SCOPED[0], {**SCOPED[0], "name": "other"}]), "are the same"),
    ],
)  # fmt: skip
def test_bad_scoped_secrets_are_refused_at_start_without_showing_them(
    raw: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("DULY_WEBHOOK_SECRETS", raw)
    with pytest.raises(ConfigurationError, match=says) as refused:
        create_app(async_sessionmaker(), run_worker=False)
    shown = str(refused.value)
    assert all(secret not in shown for secret in (SECRET, REFUNDS_SECRET, "short-secret"))


def test_a_secret_is_never_in_its_repr() -> None:
    assert "hidden-value" not in repr(SigningSecret("x", "hidden-value-of-16", None))


async def test_scoped_secrets_alone_close_the_writes(
    Session: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_WEBHOOK_SECRETS", json.dumps(SCOPED))
    async with serving(create_app(Session, run_worker=False)) as client:
        unsigned = await client.post("/workflows/refund/cancel", json={"key": 9001})
        assert unsigned.status_code == 401, unsigned.text
        assert "X-Duly-Signature" in unsigned.json()["detail"]
        path = "/workflows/refund/cancel"
        body = b'{"key": 9001}'
        headers = signed("POST", path, body, secret=REFUNDS_SECRET)
        assert (await client.post(path, content=body, headers=headers)).status_code == 200


async def test_a_database_without_the_table_is_told_to_migrate(db: Database) -> None:
    with pytest.raises(ConfigurationError, match=r"no duly_seen_signatures table.*duly migrate"):
        await record_signature(db.engine(), b"\x01" * 32, int(time.time()), 300)
