"""The console's graph pages over HTTP (Graphs and Designer), against the dev app.

- the index lists each template's versions (the active one marked) and the
  recent instances, and offers `duly dev`'s example claim:
  test_the_index_lists_versions_and_instances
- a version's page draws the stored designer layout while it matches the
  graph, and asks for an automatic layout once it does not:
  test_the_stored_layout_is_drawn_only_while_it_matches
- activation from the page: an invalid version is refused with the API's
  status and its problems, a valid one is activated:
  test_activation_refuses_an_invalid_version_and_activates_a_valid_one
- the submit form submits as the API does, and a second submit of the subject
  is refused with the API's 409 and message: test_the_submit_form_refuses_as_the_api
- the moves shown are the acting user's own; a move needing a comment is
  refused without one, with the runtime's message; taking one by its form
  moves the branch and the history says so, as done by `local` (open mode's
  principal) on behalf of the user picked:
  test_moves_are_the_acting_users_and_go_through_the_runtime
- the instance's diagram marks its branches, what was visited and the edges
  taken (through a fork, a join and a condition):
  test_the_instance_diagram_marks_branches_visits_and_taken_edges
- the cancel form cancels: test_the_cancel_form_cancels
- the designer's save is a new inactive version whose problems name their
  node, or their edge: test_the_designers_save_names_the_nodes_and_edges_of_problems
- the designer opens a copy of a version, based on it:
  test_the_designer_edits_a_copy_of_a_version
- the example's claim form shows only while the dev app serves the examples:
  test_the_index_lists_versions_and_instances, test_a_users_own_app_has_no_example_form
- a branch card shows each move's votes against the state's threshold:
  test_a_branch_card_shows_the_votes_for_each_move
- the instance page's live part answers 204 while nothing changed, and the new
  part once the instance moved: test_the_live_part_answers_204_until_the_instance_moves
- an unknown instance or version is an HTML 404: test_unknown_pages_are_404
- the pages' forms carry the console's CSRF token (the move forms are posted
  with their own fields alone), and a write without it is refused before it
  reaches the runtime: test_writes_need_the_forms_csrf_token
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from engine import get_graph_runtime
from engine.graphs.design.document import Design
from functions import examples
from functions.expense_graph import DESIGN, EXPENSE_APPROVAL
from functions.local.dev import create_dev_app, install_example_graph
from functions.requests.graphs import save_version
from tests.conftest import Database
from tests.helpers import csrf_of, serving

FAST_WORKER = {"max_idle_interval": timedelta(seconds=0.5)}
PAGES = "/console/graphs"


@pytest.fixture
async def client(db: Database, dev_app_configured: None) -> AsyncIterator[httpx.AsyncClient]:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, worker_options=FAST_WORKER)) as served:
        await install_example_graph()
        yield served


async def write(client: httpx.AsyncClient, path: str, **given: Any) -> httpx.Response:
    """A console write with the CSRF token the pages' forms carry (as the designer's header)."""
    token = csrf_of(await client.get(PAGES))
    return await client.post(path, headers={"X-CSRF-Token": token}, **given)


def diagram_of(page: httpx.Response) -> dict[str, Any]:
    """The JSON a page hands its diagram."""
    found = re.search(
        r'<script type="application/json" id="diagram-data">(.*?)</script>', page.text
    )
    assert found is not None, "the page has no diagram data"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


async def active_version(client: httpx.AsyncClient) -> dict[str, Any]:
    listed = (await client.get("/graphs/templates")).json()["templates"]
    [active] = [t for t in listed if t["name"] == EXPENSE_APPROVAL and t["is_active"]]
    return dict(active)


async def new_claim(client: httpx.AsyncClient, amount: int = 250) -> dict[str, Any]:
    made = await client.post(
        "/dev/expense-claims", json={"title": "Trip", "amount": amount, "submitted_by": "sam"}
    )
    assert made.status_code == 201, made.text
    return dict(made.json())


async def submit(client: httpx.AsyncClient, amount: int = 250) -> str:
    """Submit a new claim through the console's form; the instance's id."""
    claim = await new_claim(client, amount)
    answer = await write(
        client,
        f"{PAGES}/instances",
        data={
            "subject_type": claim["subject_type"],
            "subject_key": claim["subject_key"],
            "workflow": EXPENSE_APPROVAL,
            "user": "sam",
        },
    )
    assert answer.status_code == 303, answer.text
    found = re.fullmatch(
        rf"{PAGES}/instances/([0-9a-f-]+)\?user=sam&done=submitted", answer.headers["location"]
    )
    assert found is not None, answer.headers["location"]
    return found.group(1)


async def take(
    client: httpx.AsyncClient, instance_id: str, user: str, name: str, comment: str = ""
) -> httpx.Response:
    """`user` presses the move button called `name` on the instance's page."""
    page = await client.get(f"{PAGES}/instances/{instance_id}", params={"user": user})
    forms = re.findall(r'<form method="post" action="[^"]*/transitions".*?</form>', page.text, re.S)
    [form] = [
        f for f in forms if re.search(rf"<button type=\"submit\">{re.escape(name)}</button>", f)
    ]
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form))
    return await client.post(
        f"{PAGES}/instances/{instance_id}/transitions", data={**fields, "comment": comment}
    )


async def test_the_index_lists_versions_and_instances(client: httpx.AsyncClient) -> None:
    instance_id = await submit(client)
    page = await client.get(PAGES)
    assert page.status_code == 200
    assert "<caption>expense-approval</caption>" in page.text
    assert re.search(
        r"expense-approval v1</a></td>\s*<td>\s*<span class=\"badge badge-active\">active",
        page.text,
    )
    assert f'href="{PAGES}/instances/{instance_id}"' in page.text
    assert 'data-claims-url="/dev/expense-claims"' in page.text  # the dev app serves examples


async def test_a_users_own_app_has_no_example_form(db: Database, dev_app_configured: None) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False, examples=False)) as client:
        await install_example_graph()
        page = await client.get(PAGES)
    assert page.status_code == 200
    assert "<caption>expense-approval</caption>" in page.text  # the graph itself is shown
    assert "example-form" not in page.text and "submit.js" not in page.text


async def test_the_stored_layout_is_drawn_only_while_it_matches(client: httpx.AsyncClient) -> None:
    version = await active_version(client)
    page = await client.get(f"{PAGES}/templates/{version['id']}")
    drawn = diagram_of(page)
    assert drawn["preset"] is True
    placed = {node["id"]: (node["x"], node["y"]) for node in drawn["nodes"]}
    assert placed["legal"] == (640, 510)  # where the example's design puts it

    # The stored layout drifts from the graph (a node it no longer has): laid out anew.
    runtime = examples.graph_runtime
    layout = {**DESIGN, "nodes": DESIGN["nodes"][:-1]}
    async with runtime.engine.begin() as conn:
        templates = runtime.tables.table("template")
        await conn.execute(
            update(templates)
            .where(templates.c.id == uuid.UUID(version["id"]))
            .values(design=layout)
        )
    drawn = diagram_of(await client.get(f"{PAGES}/templates/{version['id']}"))
    assert drawn["preset"] is False
    assert len(drawn["nodes"]) == len(DESIGN["nodes"])  # the graph, not the stale layout


async def test_activation_refuses_an_invalid_version_and_activates_a_valid_one(
    client: httpx.AsyncClient,
) -> None:
    broken = json.loads(json.dumps(DESIGN))
    broken["nodes"][1]["assigneeUserIds"] = []  # the manager's state has nobody: S16
    saved = (await write(client, f"{PAGES}/designer/save", json=broken)).json()
    refused = await write(client, f"{PAGES}/templates/{saved['template_id']}/activate")
    assert refused.status_code == 400
    assert "cannot be activated" in refused.text
    assert "S16: &#39;Manager review&#39; has no assignees" in refused.text
    assert "Activate version" not in refused.text  # no button for an invalid version

    saved = (await write(client, f"{PAGES}/designer/save", json=DESIGN)).json()
    page = await client.get(f"{PAGES}/templates/{saved['template_id']}")
    assert f"Activate version {saved['version']}" in page.text
    done = await write(client, f"{PAGES}/templates/{saved['template_id']}/activate")
    assert done.status_code == 303
    assert done.headers["location"] == f"{PAGES}/templates/{saved['template_id']}?done=activated"
    assert (await active_version(client))["id"] == saved["template_id"]


async def test_the_submit_form_refuses_as_the_api(client: httpx.AsyncClient) -> None:
    claim = await new_claim(client)
    form = {
        "subject_type": claim["subject_type"],
        "subject_key": claim["subject_key"],
        "workflow": EXPENSE_APPROVAL,
        "user": "sam",
    }
    assert (await write(client, f"{PAGES}/instances", data=form)).status_code == 303
    again = await write(client, f"{PAGES}/instances", data=form)
    api = await client.post("/graphs/instances", json=form)
    assert (again.status_code, api.status_code) == (409, 409)
    assert "already has an active workflow instance" in again.text
    missing = await write(client, f"{PAGES}/instances", data={**form, "subject_key": "999999"})
    assert missing.status_code == 404
    assert "No expense_claims row has the key" in missing.text


async def test_moves_are_the_acting_users_and_go_through_the_runtime(
    client: httpx.AsyncClient,
) -> None:
    instance_id = await submit(client)
    as_mia = await client.get(f"{PAGES}/instances/{instance_id}", params={"user": "mia"})
    assert re.findall(r'<button type="submit">([^<]+)</button>', as_mia.text)[1:3] == [
        "Approve",
        "Reject",
    ]
    assert 'name="comment" required' in as_mia.text  # Reject needs a comment
    as_fred = await client.get(f"{PAGES}/instances/{instance_id}", params={"user": "fred"})
    assert "fred may not move this branch now." in as_fred.text

    refused = await take(client, instance_id, "mia", "Reject")
    assert refused.status_code == 400
    assert "requires a comment" in refused.text

    moved = await take(client, instance_id, "mia", "Approve")
    assert moved.status_code == 303
    assert moved.headers["location"].endswith("?user=mia&done=moved")
    history = (await client.get(f"/graphs/instances/{instance_id}/history")).json()["history"]
    assert "Moved from 'Manager review' to 'Finance and legal'." in [e["message"] for e in history]
    page = await client.get(
        f"{PAGES}/instances/{instance_id}", params={"user": "fred", "done": "voted"}
    )
    assert "Branch 2 on Finance review" in page.text and "Branch 3 on Legal review" in page.text
    # Open mode keeps the picker; its user is acted for, on behalf of `local`.
    assert 'for="acting-user">Acting on behalf of (user id)' in page.text
    assert "Acting: local on behalf of fred" in page.text
    assert '<span class="actor">local on behalf of mia</span>' in page.text

    voted = await take(client, instance_id, "fred", "Finance approves")
    assert voted.headers["location"].endswith("?user=fred&done=voted")  # 1 of 2: no move yet


async def test_a_branch_card_shows_the_votes_for_each_move(client: httpx.AsyncClient) -> None:
    instance_id = await submit(client)
    assert (await take(client, instance_id, "mia", "Approve")).status_code == 303
    before = await client.get(f"{PAGES}/instances/{instance_id}", params={"user": "fred"})
    # Finance decides by majority of its three: two votes move the branch.
    assert "Votes (majority, 2 of 3 needed):" in before.text
    assert '<span class="move">Finance approves</span>: <strong>0 of 2</strong>' in before.text
    assert (await take(client, instance_id, "fay", "Finance approves")).status_code == 303
    after = await client.get(f"{PAGES}/instances/{instance_id}", params={"user": "fred"})
    assert '<span class="move">Finance approves</span>: <strong>1 of 2</strong> (fay)' in after.text
    # Legal's single approval counts no votes: its card has no tally.
    legal = after.text.split("Branch 3 on Legal review")[1].split("</section>")[0]
    assert "Votes (" not in legal


async def test_the_live_part_answers_204_until_the_instance_moves(
    client: httpx.AsyncClient,
) -> None:
    instance_id = await submit(client)
    page = await client.get(f"{PAGES}/instances/{instance_id}", params={"user": "mia"})
    [seen] = re.findall(r'data-fingerprint="([0-9a-f]+)"', page.text)
    live = f"{PAGES}/instances/{instance_id}/live"
    same = await client.get(live, params={"user": "mia", "seen": seen})
    assert (same.status_code, same.text) == (204, "")
    # Moved by the API, not the page: the fragment answers with what changed.
    branch = (await client.get(f"/graphs/instances/{instance_id}")).json()["branches"][0]
    choices = await client.get(
        f"/graphs/instances/{instance_id}/transitions", params={"user": "mia"}
    )
    [approve] = [c for c in choices.json()["transitions"] if c["display_name"] == "Approve"]
    moved = await client.post(
        f"/graphs/instances/{instance_id}/transitions",
        json={"branch_id": branch["id"], "target_id": approve["target_id"], "user": "mia"},
    )
    assert moved.status_code == 200, moved.text
    changed = await client.get(live, params={"user": "mia", "seen": seen})
    assert changed.status_code == 200
    assert changed.text.lstrip().startswith('<div id="instance-live"')
    assert "Branch 2 on Finance review" in changed.text
    assert re.findall(r'data-fingerprint="([0-9a-f]+)"', changed.text) != [seen]
    assert "<html" not in changed.text  # a fragment, not a page


async def test_the_instance_diagram_marks_branches_visits_and_taken_edges(
    client: httpx.AsyncClient,
) -> None:
    instance_id = await submit(client, amount=2500)
    for user, name in [
        ("mia", "Approve"),
        ("fred", "Finance approves"),
        ("fay", "Finance approves"),
    ]:
        assert (await take(client, instance_id, user, name)).status_code == 303
    drawn = diagram_of(await client.get(f"{PAGES}/instances/{instance_id}"))
    assert drawn["current"] == {"legal": [3]}
    assert set(drawn["visited"]) == {"start", "manager", "reviews", "finance", "legal", "reviewed"}
    assert sorted(map(tuple, drawn["trail"])) == [
        ("finance", "reviewed"),
        ("manager", "reviews"),
        ("reviews", "finance"),
        ("reviews", "legal"),
        ("start", "manager"),
    ]

    assert (await take(client, instance_id, "lee", "Legal approves")).status_code == 303
    drawn = diagram_of(await client.get(f"{PAGES}/instances/{instance_id}"))
    assert drawn["current"] == {"signoff": [4]}
    assert {("legal", "reviewed"), ("reviewed", "large"), ("large", "signoff")} <= set(
        map(tuple, drawn["trail"])
    )
    assert ("large", "approved") not in set(map(tuple, drawn["trail"]))


async def test_the_cancel_form_cancels(client: httpx.AsyncClient) -> None:
    instance_id = await submit(client)
    done = await write(
        client, f"{PAGES}/instances/{instance_id}/cancel", data={"user": "sam", "reason": "typo"}
    )
    assert done.status_code == 303
    instance = (await client.get(f"/graphs/instances/{instance_id}")).json()
    assert instance["state_status"] == "cancelled"
    again = await write(client, f"{PAGES}/instances/{instance_id}/cancel", data={"user": "sam"})
    assert again.status_code == 409  # the API's WORKFLOW_COMPLETED


async def test_the_designers_save_names_the_nodes_and_edges_of_problems(
    client: httpx.AsyncClient,
) -> None:
    design = {
        "name": "tiny",
        "stateChoices": ["review"],
        "nodes": [
            {"id": "start", "type": "start", "name": "Start", "x": 0, "y": 0},
            {
                "id": "review",
                "type": "state",
                "name": "Review",
                "x": 0,
                "y": 100,
                "stateCode": "review",
            },
            {"id": "end", "type": "end", "name": "Done", "x": 0, "y": 200},
        ],
        "connections": [
            {"source": "start", "target": "review"},
            {"source": "review", "target": "end", "label": "Finish", "conditionResult": "true"},
        ],
    }
    answer = await write(client, f"{PAGES}/designer/save", json=design)
    assert answer.status_code == 200, answer.text
    saved = answer.json()
    assert (saved["success"], saved["version"], saved["step_count"]) == (True, 1, 3)
    assert saved["errors"] == [p["message"] for p in saved["problems"]]
    by_code = {p["code"]: p for p in saved["problems"]}
    assert by_code["S16"]["node"] == "review" and by_code["S16"]["edge"] is None
    assert by_code["S10"]["edge"] == {"source": "review", "target": "end"}
    assert saved["activate_url"] == f"{PAGES}/templates/{saved['template_id']}/activate"
    listed = (await client.get("/graphs/templates")).json()["templates"]
    [tiny] = [t for t in listed if t["name"] == "tiny"]
    assert tiny["is_active"] is False

    bad = await write(client, f"{PAGES}/designer/save", json={**design, "nodes": []})
    assert bad.status_code == 422  # the API's own check of the designer JSON, as JSON
    assert bad.json()["detail"][0]["loc"] == ["body", "nodes"]


async def test_the_designer_edits_a_copy_of_a_version(client: httpx.AsyncClient) -> None:
    version = await active_version(client)
    page = await client.get(f"{PAGES}/designer/{version['id']}")
    assert page.status_code == 200
    found = re.search(
        r'<script type="application/json" id="designer-data">(.*?)</script>', page.text
    )
    assert found is not None
    data = json.loads(found.group(1))
    assert data["design"]["baseTemplateId"] == version["id"]
    assert data["design"]["name"] == EXPENSE_APPROVAL
    assert data["conditions"] == ["expense_over_limit"]
    assert data["preset"] is True
    saved = (await write(client, f"{PAGES}/designer/save", json=data["design"])).json()
    assert (saved["version"], saved["errors"]) == (2, [])


async def test_unknown_pages_are_404(client: httpx.AsyncClient) -> None:
    for path in (
        f"instances/{uuid.uuid4()}",
        f"templates/{uuid.uuid4()}",
        f"designer/{uuid.uuid4()}",
    ):
        page = await client.get(f"{PAGES}/{path}")
        assert page.status_code == 404
        assert page.headers["content-type"].startswith("text/html")


async def test_writes_need_the_forms_csrf_token(client: httpx.AsyncClient) -> None:
    claim = await new_claim(client)
    form = {"subject_type": "expense_claims", "subject_key": claim["subject_key"], "user": "sam"}
    refused = await client.post(f"{PAGES}/instances", data={**form, "workflow": EXPENSE_APPROVAL})
    assert refused.status_code == 403
    assert "CSRF token" in refused.text
    index = await client.get(PAGES)
    assert f"expense_claims {claim['subject_key']}" not in index.text  # nothing submitted
    assert 'name="csrf_token"' in index.text  # the submit form carries it


async def test_the_api_and_the_designer_save_through_the_request_layer(
    client: httpx.AsyncClient,
) -> None:
    design = {**json.loads(json.dumps(DESIGN)), "name": "saved three ways"}
    design["nodes"][1]["assigneeUserIds"] = []  # a problem (S16) each door must say alike
    by_api = (await write(client, "/graphs/templates", json=design)).json()
    by_designer = (await write(client, f"{PAGES}/designer/save", json=design)).json()
    direct = (await save_version(get_graph_runtime(), Design.model_validate(design))).response()
    assert [a["version"] for a in (by_api, by_designer, direct)] == [1, 2, 3]
    assert by_api["errors"] == by_designer["errors"] == direct["errors"] != []
