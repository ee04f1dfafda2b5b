"""The console offers each visitor only the forms its role may use, over real HTTP.

- a viewer sees no Run, Deliver, Cancel, Start, Bulk, replay, clock or schedule form; an operator
  sees them all: test_each_role_sees_only_the_forms_it_may_use
"""

from __future__ import annotations

import json

import httpx
import pytest

from engine.testing import drain
from functions import examples
from functions.examples import Digest
from functions.identity.keys import digest_of, new_key
from functions.local.dev import create_dev_app
from tests.conftest import Database
from tests.helpers import csrf_of, serving

OPERATOR_KEY = new_key()
VIEWER_KEY = new_key()
KEYS = [
    {"name": "ops", "roles": ["operator"], "sha256": digest_of(OPERATOR_KEY)},
    {"name": "dashboard", "roles": ["viewer"], "sha256": digest_of(VIEWER_KEY)},
]
# What each form posts to, as the pages write it; the run is the demo's first.
FORMS = {
    "run": '/console/runs/onboarding/1/run"',
    "deliver": '/console/runs/onboarding/1/deliver"',
    "cancel": '/console/runs/onboarding/1/cancel"',
    "start": 'href="/console/runs/onboarding/start"',
    "bulk": 'id="bulk-link"',
    "clock": 'action="/console/clock"',
    "replay": 'action="/console/outbox/replay"',
    "bulk form": 'action="/console/bulk/onboarding"',
    "schedule": 'action="/console/schedules/trigger"',
}


async def shown(client: httpx.AsyncClient, key: str) -> dict[str, bool]:
    """Log in with `key`; which of FORMS the pages it reads show."""
    token = csrf_of(await client.get("/console/login"))
    login = {"csrf_token": token, "token": key, "next": "/console"}
    assert (await client.post("/console/login", data=login)).status_code == 303
    pages = ["/console", "/console/runs/onboarding/1", "/console/runs/onboarding"]
    pages += ["/console/outbox", "/console/bulk/onboarding", "/console/schedules"]
    text = ""
    for page in pages:
        reply = await client.get(page)
        assert reply.status_code == 200, (page, reply.text)
        text += reply.text
    return {name: marker in text for name, marker in FORMS.items()}


async def test_each_role_sees_only_the_forms_it_may_use(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_API_KEYS", json.dumps(KEYS))
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        started = await client.post(
            "/dev/onboarding",
            json={"user_id": "u", "email": "u@example.com"},
            headers={"authorization": f"Bearer {OPERATOR_KEY}"},
        )
        assert started.json() == {"started": True, "id": 1}
        dead = await client.post(
            "/dev/expenses",
            json={"expense_id": 1, "amount": 5},
            headers={"authorization": f"Bearer {OPERATOR_KEY}"},
        )
        assert dead.status_code == 200
        db.sql("UPDATE duly_outbox SET status = 'dead_letter'")
        assert await Digest(name="weekday").start(Digest.send)
        await drain(Session, [Digest])  # its first firing puts it on its cron
        operator = await shown(client, OPERATOR_KEY)
        client.cookies.clear()
        viewer = await shown(client, VIEWER_KEY)
        page = await client.get("/console/runs/onboarding/1")
        schedules = await client.get("/console/schedules")
    assert operator == dict.fromkeys(FORMS, True)
    assert viewer == dict.fromkeys(FORMS, False)
    assert "Your role may read this run, not act on it." in page.text
    assert "Your role may read the schedules, not pause" in schedules.text
