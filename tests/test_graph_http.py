"""Graph workflows over HTTP: a save, the example end to end, and the routes' refusals.

- the example response of a save with errors, through HTTP: a 14-node
  graph saved a second time is version 2, saved, with its S16 error:
  test_a_save_with_errors_answers_the_example_response
- the expense-approval example `duly dev` ships runs through the API end to end:
  a claim created, submitted, approved by the manager, forked into finance
  (majority of three) and legal, joined, routed by the amount condition to the
  director, signed off; the claim's state follows; notifications go through
  the outbox to the example's handlers: test_the_expense_approval_example_runs_through_the_api
- the example's manager deadline escalates to the director when the clock
  passes it (the engine's timers, the worker running in the app):
  test_the_managers_deadline_escalates_through_the_worker
- refusals answer with the runtime's status and code: a non-assignee's move
  400 STATE_WORKFLOW_ERROR, a second submit 409 SUBMISSION_ERROR, a move on a
  completed instance 409 WORKFLOW_COMPLETED, activation of an invalid version
  400 TEMPLATE_INVALID with its errors, an unknown instance 404, a design with
  no nodes or a malformed id 422: test_refusals_answer_with_status_and_code
- a move takes its target as `target_id`, the name the picker answers; the old
  `target_node_id` is a 422 naming `target_id`, and nothing moves:
  test_a_move_under_the_targets_old_name_is_refused_naming_the_new_one
- cancel over HTTP ends the instance and clears the subject's state:
  test_cancel_over_http
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from engine import GraphRuntime, graph_tables
from engine.graphs.configure import configure_graph_runtime, forget_graph_runtime
from engine.graphs.moves.conditions import ConditionRegistry
from functions import examples
from functions.app import create_app
from functions.local.dev import create_dev_app, install_example_graph
from tests.apps import graphs as graph_app
from tests.conftest import Database
from tests.helpers import serving, wait_until

FAST_WORKER = {"max_idle_interval": timedelta(seconds=0.5)}
SETTLE = 5.0


@pytest.fixture
async def example_client(
    db: Database, dev_app_configured: None
) -> AsyncIterator[httpx.AsyncClient]:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, worker_options=FAST_WORKER)) as client:
        await install_example_graph()
        yield client


async def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


async def new_claim(client: httpx.AsyncClient, amount: int) -> dict[str, Any]:
    claim = await ok(
        await client.post(
            "/dev/expense-claims",
            json={"title": "Conference trip", "amount": amount, "submitted_by": "sam"},
        ),
        201,
    )
    instance = await ok(
        await client.post(
            "/graphs/instances",
            json={
                "subject_type": claim["subject_type"],
                "subject_key": claim["subject_key"],
                "user": "sam",
                "workflow": claim["workflow"],
            },
        ),
        201,
    )
    return {"claim": claim, "instance": instance}


async def move(
    client: httpx.AsyncClient, instance_id: str, user: str, label: str, comment: str = ""
) -> dict[str, Any]:
    """`user` takes the transition labelled (or named) `label` that the picker offers."""
    offered = await ok(await client.get(f"/graphs/instances/{instance_id}/transitions?user={user}"))
    [choice] = [t for t in offered["transitions"] if t["display_name"] == label]
    return await ok(
        await client.post(
            f"/graphs/instances/{instance_id}/transitions",
            json={
                "branch_id": choice["branch_id"],
                "target_id": choice["target_id"],
                "user": user,
                "comment": comment,
            },
        )
    )


async def claim_state(claim_id: int) -> str | None:
    runtime = examples.graph_runtime
    async with runtime.engine.connect() as conn:
        table = examples.ExpenseClaim.__table__
        state: str | None = await conn.scalar(
            select(table.c.workflow_state).where(table.c.id == claim_id)
        )
        return state


def states_of(instance: dict[str, Any]) -> list[str]:
    return sorted(branch["state_code"] or branch["node_type"] for branch in instance["branches"])


async def test_the_expense_approval_example_runs_through_the_api(
    example_client: httpx.AsyncClient,
) -> None:
    client = example_client
    templates = await ok(await client.get("/graphs/templates"))
    [template] = templates["templates"]
    assert (template["name"], template["version"], template["is_active"]) == (
        "expense-approval",
        1,
        True,
    )
    emails_before = len(examples.sent_emails)
    started = await new_claim(client, amount=2500)
    instance, claim_id = started["instance"], started["claim"]["id"]
    iid = instance["id"]
    assert states_of(instance) == ["manager_review"]
    assert await claim_state(claim_id) == "manager_review"

    offered = await ok(await client.get(f"/graphs/instances/{iid}/transitions?user=mia"))
    assert [t["display_name"] for t in offered["transitions"]] == ["Approve", "Reject"]
    assert (await ok(await client.get(f"/graphs/instances/{iid}/transitions?user=fred"))) == {
        "transitions": []
    }

    moved = await move(client, iid, "mia", "Approve")
    assert moved["moved"] is True
    assert states_of(moved["instance"]) == ["finance_review", "legal_review"]

    # Finance decides by majority of three: one vote is progress, the second moves.
    voted = await move(client, iid, "fred", "Finance approves")
    assert (voted["moved"], voted["approved_count"], voted["required_approvals"]) == (
        False,
        1,
        2,
    )
    voted = await move(client, iid, "fay", "Finance approves")
    assert voted["moved"] is True
    assert states_of(voted["instance"]) == ["legal_review"]

    # Legal's arrival fires the join; 2,500 is over the limit: the director signs off.
    joined = await move(client, iid, "lee", "Legal approves")
    assert states_of(joined["instance"]) == ["director_signoff"]
    assert await claim_state(claim_id) == "director_signoff"

    done = await move(client, iid, "dana", "Sign off")
    final = done["instance"]
    assert (final["state_status"], final["status"], final["is_completed"]) == (
        "completed",
        "approved",
        True,
    )
    assert final["branches"] == []
    assert await claim_state(claim_id) == "approved"

    history = (await ok(await client.get(f"/graphs/instances/{iid}/history")))["history"]
    kinds = [entry["action_type"] for entry in history]
    assert kinds[0] == "creation" and kinds[-1] == "completion"
    assert kinds.count("approval") == 5  # mia, fred, fay, lee, dana

    # Notifications went through the outbox to the example's handlers.
    async def mailed() -> bool:
        sent = examples.sent_emails[emails_before:]
        return ("sam@example.com", "state_completion") in sent and (
            "mia@example.com",
            "state_assignment:manager_review",
        ) in sent

    await wait_until(mailed, timeout=SETTLE)
    sent = examples.sent_emails[emails_before:]
    for who in ("fred", "fay", "flo"):
        assert (f"{who}@example.com", "state_assignment:finance_review") in sent


async def test_a_small_claim_skips_the_director(example_client: httpx.AsyncClient) -> None:
    client = example_client
    started = await new_claim(client, amount=300)
    iid = started["instance"]["id"]
    await move(client, iid, "mia", "Approve")
    await move(client, iid, "fred", "Finance approves")
    await move(client, iid, "flo", "Finance approves")
    done = await move(client, iid, "lee", "Legal approves")
    assert done["instance"]["state_status"] == "completed"
    assert await claim_state(started["claim"]["id"]) == "approved"


async def test_the_managers_deadline_escalates_through_the_worker(
    example_client: httpx.AsyncClient,
) -> None:
    client = example_client
    started = await new_claim(client, amount=100)
    iid = started["instance"]["id"]
    await ok(await client.post("/dev/clock", json={"days": 2, "minutes": 1}))
    try:

        async def escalated() -> bool:
            instance = await ok(await client.get(f"/graphs/instances/{iid}"))
            return states_of(instance) == ["director_review"]

        await wait_until(escalated, timeout=SETTLE)
        history = (await ok(await client.get(f"/graphs/instances/{iid}/history")))["history"]
        [escalation] = [e for e in history if e["metadata"].get("escalated")]
        assert escalation["actor"] is None
        assert escalation["metadata"]["to_state"] == "director_review"
    finally:
        await ok(await client.post("/dev/clock/reset"))


async def test_refusals_answer_with_status_and_code(example_client: httpx.AsyncClient) -> None:
    client = example_client
    started = await new_claim(client, amount=50)
    claim, iid = started["claim"], started["instance"]["id"]
    branch = started["instance"]["branches"][0]
    offered = await ok(await client.get(f"/graphs/instances/{iid}/transitions?user=mia"))
    approve = next(t for t in offered["transitions"] if t["display_name"] == "Approve")
    reject = next(t for t in offered["transitions"] if t["display_name"] == "Reject")

    stranger = await client.post(
        f"/graphs/instances/{iid}/transitions",
        json={"branch_id": branch["id"], "target_id": approve["target_id"], "user": "eve"},
    )
    assert stranger.status_code == 400
    assert stranger.json()["code"] == "STATE_WORKFLOW_ERROR"

    no_comment = await client.post(
        f"/graphs/instances/{iid}/transitions",
        json={"branch_id": branch["id"], "target_id": reject["target_id"], "user": "mia"},
    )
    assert no_comment.status_code == 400
    assert "comment" in no_comment.json()["detail"]

    again = await client.post(
        "/graphs/instances",
        json={
            "subject_type": claim["subject_type"],
            "subject_key": claim["subject_key"],
            "workflow": claim["workflow"],
        },
    )
    assert again.status_code == 409
    assert again.json()["code"] == "SUBMISSION_ERROR"

    await move(client, iid, "mia", "Reject", comment="Not a business trip.")
    assert await claim_state(claim["id"]) == "rejected"
    late = await client.post(
        f"/graphs/instances/{iid}/transitions",
        json={"branch_id": branch["id"], "target_id": approve["target_id"], "user": "mia"},
    )
    assert late.status_code == 409
    assert late.json()["code"] == "WORKFLOW_COMPLETED"

    missing = await client.get("/graphs/instances/00000000-0000-4000-8000-000000000000")
    assert missing.status_code == 404
    assert (await client.get("/graphs/instances/not-a-uuid")).status_code == 422
    empty = await client.post("/graphs/templates", json={"name": "empty", "nodes": []})
    assert empty.status_code == 422
    unknown_subject = await client.post(
        "/graphs/instances", json={"subject_type": "nope", "subject_key": "1"}
    )
    assert unknown_subject.status_code == 404
    bad_key = await client.post(
        "/graphs/instances", json={"subject_type": "expense_claims", "subject_key": "one"}
    )
    assert bad_key.status_code == 400

    # An invalid version saves, but is refused activation with its errors.
    broken = {
        "name": "broken",
        "nodes": [
            {"id": "s", "type": "start", "name": "Start", "x": 0, "y": 0},
            {"id": "e", "type": "end", "name": "End", "x": 0, "y": 100},
        ],
        "connections": [{"source": "s", "target": "e"}],
    }
    saved = await ok(await client.post("/graphs/templates", json=broken))
    assert saved["errors"] and saved["success"] is True
    refused = await client.post(f"/graphs/templates/{saved['template_id']}/activate")
    assert refused.status_code == 400
    assert refused.json()["code"] == "TEMPLATE_INVALID"
    assert refused.json()["errors"] == saved["errors"]


async def test_a_move_under_the_targets_old_name_is_refused_naming_the_new_one(
    example_client: httpx.AsyncClient,
) -> None:
    client = example_client
    started = await new_claim(client, amount=50)
    iid, branch = started["instance"]["id"], started["instance"]["branches"][0]
    offered = await ok(await client.get(f"/graphs/instances/{iid}/transitions?user=mia"))
    approve = next(t for t in offered["transitions"] if t["display_name"] == "Approve")
    before = await ok(await client.get(f"/graphs/instances/{iid}/history"))

    old = await client.post(
        f"/graphs/instances/{iid}/transitions",
        json={"branch_id": branch["id"], "target_node_id": approve["target_id"], "user": "mia"},
    )
    assert old.status_code == 422, old.text
    [error] = old.json()["detail"]
    assert error["type"] == "renamed_field"
    assert "send target_id" in error["msg"]
    assert approve["target_id"] not in old.text  # the value is never echoed
    assert await ok(await client.get(f"/graphs/instances/{iid}/history")) == before
    assert (await ok(await client.get(f"/graphs/instances/{iid}")))["branches"] == [branch]

    moved = await move(client, iid, "mia", "Approve")
    assert moved["target_id"] == approve["target_id"]


async def test_cancel_over_http(example_client: httpx.AsyncClient) -> None:
    client = example_client
    started = await new_claim(client, amount=700)
    iid = started["instance"]["id"]
    await move(client, iid, "mia", "Approve")
    cancelled = await ok(
        await client.post(f"/graphs/instances/{iid}/cancel", json={"user": "sam", "reason": "dup"})
    )
    assert (cancelled["state_status"], cancelled["status"], cancelled["branches"]) == (
        "cancelled",
        "rejected",
        [],
    )
    assert await claim_state(started["claim"]["id"]) in (None, "")
    again = await client.post(f"/graphs/instances/{iid}/cancel", json={})
    assert again.status_code == 409


# -- the example save response -------------------------------------------------------------

EXAMPLE_NODES = [
    ("start", "start", "Start", {}),
    ("submitted", "state", "Submitted", {"stateCode": "submitted"}),
    ("triage", "state", "Triage", {"stateCode": "triage"}),
    ("reviews", "fork", "Reviews", {}),
    ("legal", "state", "Legal", {"stateCode": "legal"}),
    ("finance", "state", "Finance", {"stateCode": "finance"}),
    ("security", "state", "Security", {"stateCode": "security"}),
    ("reviewed", "join", "Reviewed", {}),
    ("large", "condition", "Large?", {"condition": "large_amount"}),
    ("manager", "state", "Manager", {"stateCode": "manager"}),
    ("director", "state", "Director", {"stateCode": "director"}),
    ("closed", "state", "Closed", {"stateCode": "closed", "assigneeUserIds": []}),
    ("archived", "end", "Archived", {}),
    ("rejected", "end", "Rejected", {}),
]
EXAMPLE_EDGES = [
    ("start", "submitted", {}),
    ("submitted", "triage", {}),
    ("triage", "reviews", {}),
    ("triage", "rejected", {}),
    ("reviews", "legal", {}),
    ("reviews", "finance", {}),
    ("reviews", "security", {}),
    ("legal", "reviewed", {}),
    ("finance", "reviewed", {}),
    ("security", "reviewed", {}),
    ("reviewed", "large", {}),
    ("large", "director", {"conditionResult": "true"}),
    ("large", "manager", {"conditionResult": "false"}),
    ("manager", "closed", {}),
    ("director", "closed", {}),
    ("closed", "archived", {}),
]


def example_design() -> dict[str, Any]:
    nodes = []
    for row, (key, kind, name, more) in enumerate(EXAMPLE_NODES):
        node = {"id": key, "type": kind, "name": name, "x": 360, "y": 60 + row * 170, **more}
        if kind == "state" and "assigneeUserIds" not in more:
            node["assigneeUserIds"] = [f"{key}-lead"]
        nodes.append(node)
    connections = [{"source": s, "target": t, **more} for s, t, more in EXAMPLE_EDGES]
    codes = [more["stateCode"] for _, _, _, more in EXAMPLE_NODES if "stateCode" in more]
    return {"name": "intake", "stateChoices": codes, "nodes": nodes, "connections": connections}


@pytest.fixture
async def graph_client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    Session = await db.create(graph_app.Base.metadata)
    conditions = ConditionRegistry()
    conditions.register("large_amount", lambda subject, instance: False)
    configure_graph_runtime(GraphRuntime(graph_tables(graph_app.Base), conditions=conditions))
    try:
        async with serving(create_app(Session, run_worker=False)) as client:
            yield client
    finally:
        forget_graph_runtime()


async def test_a_save_with_errors_answers_the_example_response(
    graph_client: httpx.AsyncClient,
) -> None:
    first = await ok(await graph_client.post("/graphs/templates", json=example_design()))
    assert first["version"] == 1
    response = await graph_client.post("/graphs/templates", json=example_design())
    body = await ok(response)
    assert set(body) == {"success", "message", "step_count", "template_id", "version", "errors"}
    assert body["success"] is True
    assert body["message"] == "Workflow saved successfully"
    assert body["step_count"] == 14
    assert body["version"] == 2
    assert isinstance(body["template_id"], str) and body["template_id"] != first["template_id"]
    [error] = body["errors"]
    assert error.startswith("S16: 'Closed' has no assignees. ")
    # Saved, inactive, and loadable with its layout.
    loaded = await ok(await graph_client.get(f"/graphs/templates/{body['template_id']}"))
    assert (loaded["version"], loaded["is_active"], len(loaded["nodes"])) == (2, False, 14)


async def test_the_engines_own_tables_take_no_runs_through_the_workflow_routes(
    example_client: httpx.AsyncClient,
) -> None:
    """A graph deadline, the outbox and durable executions are moved through their own API:
    `/workflows/{name}/...` refuses to start, run, deliver to or cancel their rows."""
    await new_claim(example_client, 5000)  # submitted: the manager's two-day deadline is armed
    before = await ok(await example_client.get("/workflows/duly_graph_timers/runs"))
    [timer] = before["runs"]
    key = timer["row"]["visit_id"]
    writes = [
        ("run", {"key": key, "step": "expire"}),
        ("deliver", {"key": key, "step": "expire", "args": {}}),
        ("cancel", {"key": key}),
        ("start", {"step": "expire", "row": {}}),
    ]
    for action, body in writes:
        refused = await example_client.post(f"/workflows/duly_graph_timers/{action}", json=body)
        assert refused.status_code == 404, (action, refused.text)
        assert "a table of the engine's own" in refused.json()["detail"], action
    outbox = await example_client.post("/workflows/duly_outbox/start", json={"step": "route"})
    assert outbox.status_code == 404
    assert "publish events with POST /events" in outbox.json()["detail"]
    after = await ok(await example_client.get("/workflows/duly_graph_timers/runs"))
    assert after["runs"] == before["runs"]  # the deadline still two days off, unrun
