"""Who may submit what, and who may vote how often, through every door (HTTP, the console).

Named API keys through the app's guard, on the expense example (`tests.graph_keys`):
- a submit starts only the template's active version: a viewer naming a draft's
  id, an invalid version's id (its activation refused) or an older version's id
  is refused (409 TEMPLATE_NOT_ACTIVE) and nothing is written; so a template
  whose active version forbids self-approval is not escaped through an older
  version, and the active version's id starts it:
  test_a_submit_starts_only_the_active_version
- a template saying only the subject's owner submits refuses vic submitting
  sam's claim (403 SUBMITTER_NOT_ALLOWED, over HTTP and in the console,
  nothing written) and takes sam's: test_only_the_owner_submits_where_the_template_says_so
- a template naming a role takes submits from its holders only; a rule that
  is none of any, owner or a role is the save's S21 problem and its
  activation is refused: test_a_role_submits_and_an_unknown_rule_is_refused
- self-approval is judged against the subject's owner: vic submits sam's
  claim, and sam, an assignee, is offered no move and refused (403
  SELF_APPROVAL): test_self_approval_is_judged_against_the_subjects_owner
- one vote a person a visit: gail's second "Finance approves" (HTTP, then the
  console's form) is refused (409 ALREADY_VOTED) and writes nothing; the
  page offers her no such move; the votes needed are the same whoever votes
  or looks (gail counted by her key's group, fred by the directory):
  test_a_second_vote_is_refused_and_not_offered
- the schema documents the new refusals' statuses on the routes that answer
  them: test_the_schema_documents_the_refusals
"""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from functions import examples
from functions.expense_graph import DESIGN
from tests.conftest import Database
from tests.graph_keys import (
    PAGES,
    bearer,
    choice,
    history,
    move_body,
    new_claim,
    offered,
    ok,
    served_with_keys,
    submit_body,
    submitted_by,
)
from tests.helpers import csrf_of

INSTANCES = examples.Base.metadata.tables["duly_graph_instances"]
HISTORY = examples.Base.metadata.tables["duly_graph_history"]


@dataclass
class Served:
    """The served app's client, and a session maker on its database to count rows."""

    client: httpx.AsyncClient
    Session: async_sessionmaker[AsyncSession]

    async def written(self) -> tuple[int, int]:
        """How many instances and history rows there are: what a refusal leaves alone."""
        async with self.Session() as session:
            instances = await session.scalar(select(func.count()).select_from(INSTANCES))
            rows = await session.scalar(select(func.count()).select_from(HISTORY))
        return int(instances or 0), int(rows or 0)


@pytest.fixture
async def served(
    db: Database, dev_app_configured: None, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Served]:
    Session = await db.create(examples.Base.metadata)
    async with served_with_keys(Session, monkeypatch) as client:
        yield Served(client, Session)


async def saved(client: httpx.AsyncClient, *, activate: bool = True, **changes: Any) -> str:
    """The expense design saved by dora (a designer) with `changes`, activated if told: its id."""
    design = copy.deepcopy(DESIGN)
    design.update(changes)
    answer = await ok(await client.post("/graphs/templates", json=design, headers=bearer("dora")))
    template_id = str(answer["template_id"])
    if activate:
        activated = await client.post(
            f"/graphs/templates/{template_id}/activate", headers=bearer("dora")
        )
        await ok(activated)
    return template_id


async def test_a_submit_starts_only_the_active_version(served: Served) -> None:
    client = served.client
    templates = await ok(await client.get("/graphs/templates", headers=bearer("vic")))
    [first] = [t["id"] for t in templates["templates"] if t["is_active"]]
    draft = await saved(client, activate=False)
    broken = copy.deepcopy(DESIGN["nodes"])
    broken[1] = {**broken[1], "assigneeUserIds": []}  # the manager's state: nobody (S16)
    invalid = await saved(client, activate=False, nodes=broken)
    refused = await client.post(f"/graphs/templates/{invalid}/activate", headers=bearer("dora"))
    assert (refused.status_code, refused.json()["code"]) == (400, "TEMPLATE_INVALID")
    # The active version forbids self-approval; the first one, now inactive, did not.
    strict = await saved(client, forbidSelfApproval=True)

    claim = await new_claim(client, "vic")
    before = await served.written()
    for template_id in (draft, invalid, first):
        body = submit_body(claim, template_id=template_id)
        answer = await client.post("/graphs/instances", json=body, headers=bearer("vic"))
        assert answer.status_code == 409, answer.text
        assert answer.json()["code"] == "TEMPLATE_NOT_ACTIVE"
        assert "not the active version" in answer.json()["detail"]
        assert await served.written() == before
    named = submit_body(claim, template_id=first)  # the name does not make an old id active
    assert (
        await client.post("/graphs/instances", json=named, headers=bearer("vic"))
    ).status_code == 409
    assert await served.written() == before

    started = await client.post(
        "/graphs/instances", json=submit_body(claim, template_id=strict), headers=bearer("vic")
    )
    instance = await ok(started, 201)
    assert instance["template_id"] == strict
    assert await ok(await offered(client, instance["id"], "vic")) == {"transitions": []}


async def test_only_the_owner_submits_where_the_template_says_so(served: Served) -> None:
    client = served.client
    await saved(client, submitters="owner")
    claim = await new_claim(client, "sam")
    before = await served.written()

    refused = await client.post("/graphs/instances", json=submit_body(claim), headers=bearer("vic"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "SUBMITTER_NOT_ALLOWED"
    assert refused.json()["detail"] == (
        f"Only the owner of expense_claims {claim['subject_key']} may submit it to "
        "'expense-approval'."
    )
    index = await client.get(PAGES, headers=bearer("vic"))
    form = {**submit_body(claim), "csrf_token": csrf_of(index)}
    in_console = await client.post(f"{PAGES}/instances", data=form, headers=bearer("vic"))
    assert in_console.status_code == 403
    assert "Only the owner of expense_claims" in in_console.text
    assert await served.written() == before

    instance = await ok(
        await client.post("/graphs/instances", json=submit_body(claim), headers=bearer("sam")), 201
    )
    assert instance["submitted_by"] == "sam"


async def test_a_role_submits_and_an_unknown_rule_is_refused(served: Served) -> None:
    client = served.client
    await saved(client, submitters="operator")
    claim = await new_claim(client, "vic")
    refused = await client.post("/graphs/instances", json=submit_body(claim), headers=bearer("vic"))
    assert (refused.status_code, refused.json()["code"]) == (403, "SUBMITTER_NOT_ALLOWED")
    assert (
        refused.json()["detail"]
        == "'expense-approval' takes submits from the 'operator' role only."
    )
    await ok(
        await client.post("/graphs/instances", json=submit_body(claim), headers=bearer("ops")), 201
    )

    design = {**copy.deepcopy(DESIGN), "submitters": "nobody"}
    answer = await ok(await client.post("/graphs/templates", json=design, headers=bearer("dora")))
    assert [e for e in answer["errors"] if e.startswith("S21")] == [
        "S21: Who may submit is 'nobody': say one of any, owner, viewer, operator, designer, admin."
    ]
    activate = f"/graphs/templates/{answer['template_id']}/activate"
    refused = await client.post(activate, headers=bearer("dora"))
    assert (refused.status_code, refused.json()["code"]) == (400, "TEMPLATE_INVALID")


async def test_self_approval_is_judged_against_the_subjects_owner(served: Served) -> None:
    client = served.client
    nodes = copy.deepcopy(DESIGN["nodes"])
    nodes[1] = {**nodes[1], "assigneeUserIds": ["mia", "sam"]}  # sam manages too
    await saved(client, nodes=nodes, forbidSelfApproval=True)
    claim = await new_claim(client, "sam")
    instance = await ok(
        await client.post("/graphs/instances", json=submit_body(claim), headers=bearer("vic")), 201
    )
    iid = instance["id"]
    assert instance["submitted_by"] == "vic"
    assert await ok(await offered(client, iid, "sam")) == {"transitions": []}
    approve = choice(await ok(await offered(client, iid, "mia")), "Approve")
    before = await history(client, iid)
    refused = await client.post(
        f"/graphs/instances/{iid}/transitions", json=move_body(approve), headers=bearer("sam")
    )
    assert (refused.status_code, refused.json()["code"]) == (403, "SELF_APPROVAL")
    assert await history(client, iid) == before
    moved = await client.post(
        f"/graphs/instances/{iid}/transitions", json=move_body(approve), headers=bearer("mia")
    )
    assert (await ok(moved))["moved"] is True


def needed_shown(page: httpx.Response) -> list[str]:
    """The tallies' "N of M needed" the page shows."""
    return re.findall(r"\d+ of \d+ needed", page.text)


async def test_a_second_vote_is_refused_and_not_offered(served: Served) -> None:
    client = served.client
    iid = (await submitted_by(client, "sam"))["id"]
    approve = choice(await ok(await offered(client, iid, "mia")), "Approve")
    await ok(
        await client.post(
            f"/graphs/instances/{iid}/transitions", json=move_body(approve), headers=bearer("mia")
        )
    )
    page_path = f"{PAGES}/instances/{iid}"
    finance = choice(await ok(await offered(client, iid, "gail")), "Finance approves")
    page = await client.get(page_path, headers=bearer("gail"))
    form = {
        "branch_id": finance["branch_id"],
        "target_id": finance["target_id"],
        "csrf_token": csrf_of(page),
    }
    first = await ok(
        await client.post(
            f"/graphs/instances/{iid}/transitions", json=move_body(finance), headers=bearer("gail")
        )
    )
    # The finance group is fred, fay and flo in the directory: 2 of 3, gail's key or not.
    assert (first["moved"], first["approved_count"], first["required_approvals"]) == (False, 1, 2)

    before = await history(client, iid)
    again = await client.post(
        f"/graphs/instances/{iid}/transitions", json=move_body(finance), headers=bearer("gail")
    )
    assert (again.status_code, again.json()["code"]) == (409, "ALREADY_VOTED")
    by_form = await client.post(f"{page_path}/transitions", data=form, headers=bearer("gail"))
    assert by_form.status_code == 409 and "one vote each" in by_form.text
    assert await history(client, iid) == before

    as_gail = await client.get(page_path, headers=bearer("gail"))
    assert '<button type="submit">Finance approves</button>' not in as_gail.text
    assert "gail has voted here" in as_gail.text
    as_fred = await client.get(page_path, headers=bearer("fred"))
    assert '<button type="submit">Finance approves</button>' in as_fred.text
    assert needed_shown(as_gail) == needed_shown(as_fred) == ["2 of 3 needed"]
    second = await ok(
        await client.post(
            f"/graphs/instances/{iid}/transitions", json=move_body(finance), headers=bearer("fred")
        )
    )
    assert (second["moved"], second["approved_count"], second["required_approvals"]) == (True, 2, 2)


async def test_the_schema_documents_the_refusals(served: Served) -> None:
    schema = await ok(await served.client.get("/openapi.json", headers=bearer("vic")))
    submit = schema["paths"]["/graphs/instances"]["post"]["responses"]
    assert {"201", "403", "404", "409"} <= set(submit)
    assert "TEMPLATE_NOT_ACTIVE" in submit["409"]["description"]
    move = schema["paths"]["/graphs/instances/{instance_id}/transitions"]["post"]["responses"]
    assert {"200", "400", "403", "404", "409"} <= set(move)
    assert "ALREADY_VOTED" in move["409"]["description"]
