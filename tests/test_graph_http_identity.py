"""Graph approvals over HTTP and the console, bound to the caller's credential.

Named API keys (DULY_API_KEYS) through the app's guard, on the expense example:
- mallory's viewer key cannot approve as mia (403, the history unchanged),
  nor ask for mia's moves, nor is offered any of her own; mia's own key
  approves, and the history names mia; a key's groups make it an assignee of a
  group's state; the admin token acting for lee is recorded as on behalf:
  test_a_key_acts_as_itself_and_only_the_admin_for_others
- a template forbidding self-approval (its page says so): mia, who submitted,
  is offered no move (API and console) and her approval is refused (403
  SELF_APPROVAL), the admin's on her behalf too; another manager approves:
  test_a_submitter_may_not_approve_her_own_claim
- the console with keys: no "acting as" picker and no `?user=`, the page
  offers the key's own moves, mallory's form naming mia is refused (403,
  nothing written), mia's form moves; an admin key's form for lee is shown
  on behalf in the page's history: test_the_console_acts_as_the_key
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from functions import examples
from functions.expense_graph import DESIGN
from tests.conftest import Database
from tests.graph_keys import (
    PAGES,
    bearer,
    choice,
    history,
    move_body,
    offered,
    ok,
    served_with_keys,
    submitted_by,
)
from tests.helpers import csrf_of


@pytest.fixture
async def served(
    db: Database, dev_app_configured: None, monkeypatch: pytest.MonkeyPatch, request: Any
) -> AsyncIterator[httpx.AsyncClient]:
    token = getattr(request, "param", "token") == "token"
    Session = await db.create(examples.Base.metadata)
    async with served_with_keys(Session, monkeypatch, token=token) as client:
        yield client


async def test_a_key_acts_as_itself_and_only_the_admin_for_others(
    served: httpx.AsyncClient,
) -> None:
    client = served
    instance = await submitted_by(client, "sam")
    iid = instance["id"]
    approve = choice(await ok(await offered(client, iid, "mia")), "Approve")
    before = await history(client, iid)

    # mallory names mia: refused before anything is written.
    forged = await client.post(
        f"/graphs/instances/{iid}/transitions",
        json=move_body(approve, "mia"),
        headers=bearer("mallory"),
    )
    assert forged.status_code == 403, forged.text
    assert forged.json()["detail"] == "mallory may not act as mia."
    assert (await offered(client, iid, "mallory", "mia")).status_code == 403
    assert await ok(await offered(client, iid, "mallory")) == {"transitions": []}
    as_herself = await client.post(
        f"/graphs/instances/{iid}/transitions", json=move_body(approve), headers=bearer("mallory")
    )
    assert (as_herself.status_code, as_herself.json()["code"]) == (400, "STATE_WORKFLOW_ERROR")
    assert await history(client, iid) == before

    # mia's own key approves, and the trail names her.
    moved = await ok(
        await client.post(
            f"/graphs/instances/{iid}/transitions", json=move_body(approve), headers=bearer("mia")
        )
    )
    assert moved["moved"] is True
    [vote] = [e for e in await history(client, iid) if e["action_type"] == "approval"]
    assert (vote["actor"], vote["acted_by"], vote["done_by"]) == ("mia", None, "mia")

    # gail's key says she is in finance (the directory does not): she is an assignee.
    assert [
        t["display_name"] for t in (await ok(await offered(client, iid, "gail")))["transitions"]
    ] == ["Finance approves"]

    # The admin token acts for lee: checked as lee, recorded as on behalf.
    legal = choice(await ok(await offered(client, iid, "api-token", "lee")), "Legal approves")
    await ok(
        await client.post(
            f"/graphs/instances/{iid}/transitions",
            json=move_body(legal, "lee"),
            headers=bearer("api-token"),
        )
    )
    last = [e for e in await history(client, iid) if e["action_type"] == "approval"][-1]
    assert (last["actor"], last["acted_by"]) == ("lee", "api-token")
    assert last["done_by"] == "api-token on behalf of lee"


async def test_a_submitter_may_not_approve_her_own_claim(served: httpx.AsyncClient) -> None:
    client = served
    design = copy.deepcopy(DESIGN)
    design["forbidSelfApproval"] = True
    design["nodes"][1]["assigneeUserIds"] = ["mia", "max"]  # two managers
    saved = await ok(await client.post("/graphs/templates", json=design, headers=bearer("ops")))
    template = f"/graphs/templates/{saved['template_id']}"
    await ok(await client.post(f"{template}/activate", headers=bearer("ops")))
    assert (await ok(await client.get(template, headers=bearer("mia"))))["forbid_self_approval"]
    drawn = await client.get(f"{PAGES}/templates/{saved['template_id']}", headers=bearer("mia"))
    assert "Self-approval is forbidden" in drawn.text

    instance = await submitted_by(client, "mia")
    iid = instance["id"]
    assert await ok(await offered(client, iid, "mia")) == {"transitions": []}
    assert await ok(await offered(client, iid, "api-token", "mia")) == {"transitions": []}
    approve = choice(await ok(await offered(client, iid, "max")), "Approve")
    before = await history(client, iid)
    page = await client.get(f"{PAGES}/instances/{iid}", headers=bearer("mia"))
    assert "mia may not move this branch now." in page.text
    assert '<button type="submit">Approve</button>' not in page.text

    for name, user in [("mia", None), ("api-token", "mia")]:
        refused = await client.post(
            f"/graphs/instances/{iid}/transitions",
            json=move_body(approve, user),
            headers=bearer(name),
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "SELF_APPROVAL"
        assert "forbids self-approval" in refused.json()["detail"]
    assert await history(client, iid) == before

    moved = await ok(
        await client.post(
            f"/graphs/instances/{iid}/transitions", json=move_body(approve), headers=bearer("max")
        )
    )
    assert moved["moved"] is True


def move_form(page: httpx.Response, name: str) -> dict[str, str]:
    """The hidden fields of the page's move form whose button is `name`."""
    forms = re.findall(r'<form method="post" action="[^"]*/transitions".*?</form>', page.text, re.S)
    [form] = [f for f in forms if f'<button type="submit">{name}</button>' in f]
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form))


@pytest.mark.parametrize("served", ["keys only"], indirect=True)
async def test_the_console_acts_as_the_key(served: httpx.AsyncClient) -> None:
    client = served
    instance = await submitted_by(client, "sam")
    page_path = f"{PAGES}/instances/{instance['id']}"

    index = await client.get(PAGES, headers=bearer("mallory"))
    assert index.status_code == 200 and 'name="user"' not in index.text
    as_mallory = await client.get(page_path, params={"user": "mia"}, headers=bearer("mallory"))
    assert as_mallory.status_code == 200
    assert 'name="user"' not in as_mallory.text  # no picker, no hidden user field
    assert "mallory may not move this branch now." in as_mallory.text
    assert '<button type="submit">Approve</button>' not in as_mallory.text

    as_mia = await client.get(page_path, headers=bearer("mia"))
    fields = move_form(as_mia, "Approve")
    assert "user" not in fields
    before = await history(client, instance["id"])

    forged = await client.post(
        f"{page_path}/transitions", data={**fields, "user": "mia"}, headers=bearer("mallory")
    )
    assert forged.status_code == 403, forged.text
    assert "mallory may not act as mia." in forged.text
    assert await history(client, instance["id"]) == before

    moved = await client.post(f"{page_path}/transitions", data=fields, headers=bearer("mia"))
    assert moved.status_code == 303, moved.text
    assert moved.headers["location"] == f"{page_path}?done=moved"  # no ?user= carried

    # An admin's form may still name a user (as the API's body may): on behalf, and shown so.
    legal = choice(await ok(await offered(client, instance["id"], "ops", "lee")), "Legal approves")
    form = {"branch_id": legal["branch_id"], "target_id": legal["target_id"], "user": "lee"}
    form["csrf_token"] = csrf_of(as_mia)
    assert (
        await client.post(f"{page_path}/transitions", data=form, headers=bearer("ops"))
    ).status_code == 303
    shown = await client.get(page_path, headers=bearer("ops"))
    assert '<span class="actor">ops on behalf of lee</span>' in shown.text
    assert '<span class="actor">mia</span>' in shown.text
