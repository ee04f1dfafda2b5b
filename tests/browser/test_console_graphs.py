"""The console's Graphs pages and Designer in a real Chromium.

- a small graph drawn in the designer with its buttons and fields (start →
  state → end; the nodes added with the keyboard alone), saved with an error
  (a state without assignees, S16) that shows on the node, fixed, saved
  valid, activated; a claim from `duly dev`'s example route submitted to it;
  its one move taken by its button:
  test_draw_save_fix_activate_submit_and_move
- the example expense graph's instance drawn with its two branches after
  the manager's approval, its history beside it:
  test_an_instance_is_drawn_with_its_branches_and_history
- an instance's page follows moves made elsewhere (the API) without a reload:
  its tallies, history, branches and diagram change, and a reason being typed
  stays: test_an_instance_page_follows_moves_made_elsewhere_and_keeps_a_form_being_filled
- every graph page passes axe-core with no serious or critical violation
  (checked inside the two tests above, on each page they open, and on the
  index and a designer copy): test_the_index_and_a_designer_copy_pass_axe
- no page logs a script error or a refused script (the console's CSP).
- screenshots `designer.png` and `graph-instance.png` (full page).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect


@pytest.fixture(autouse=True)
def no_script_errors(page: Page) -> Iterator[None]:
    """Each test ends with no script error and no console error (a CSP refusal is one)."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "console",
        lambda message: errors.append(message.text) if _is_error(message) else None,
    )
    yield
    assert errors == []


def _is_error(message: ConsoleMessage) -> bool:
    return message.type == "error"


def canvas_has(page: Page, canvas: str, element: str, cls: str) -> bool:
    """Whether the Cytoscape element (by key) of the diagram in #canvas carries a class."""
    found: Any = page.evaluate(
        "([canvas, element, cls]) =>"
        " document.getElementById(canvas).cy.getElementById(element).hasClass(cls)",
        [canvas, element, cls],
    )
    return bool(found)


def add_node(page: Page, node_type: str, name: str) -> None:
    """Add a node with the keyboard alone: type, name, Tab to the button, Enter."""
    page.locator("#add-type").select_option(node_type)
    page.locator("#add-name").fill(name)
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Add node")).to_be_focused()
    page.keyboard.press("Enter")


def connect(page: Page, source: str, target: str, label: str = "") -> None:
    panel = page.get_by_role("group", name="Connect two nodes")
    panel.get_by_label("From", exact=True).select_option(source)
    panel.get_by_label("To", exact=True).select_option(target)
    panel.get_by_label("Label").fill(label)
    panel.get_by_role("button", name="Connect").click()


def test_draw_save_fix_activate_submit_and_move(
    page: Page, screenshots: Path, accessible: Callable[[Page], None]
) -> None:
    name = f"review-{uuid.uuid4().hex[:6]}"
    page.goto("/console/graphs/designer")
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("State codes").fill("in_review")
    add_node(page, "start", "Start")
    add_node(page, "state", "Review")
    page.get_by_label("State code", exact=True).fill("in_review")
    add_node(page, "end", "Done")
    connect(page, "start-1", "state-2")
    connect(page, "state-2", "end-3", "Finish")
    accessible(page)

    # Saved with an error: the state has nobody to move it.
    page.get_by_role("button", name="Save as a new version").click()
    status = page.locator("#save-status")
    expect(status).to_contain_text("Saved version 1 with 1 problem")
    problem = page.locator("#problem-list").get_by_role("button")
    expect(problem).to_have_text(
        "S16: 'Review' has no assignees. Name at least one user or group who may move this state."
    )
    page.get_by_label("Edit node").select_option("end-3")  # away from the node, then back
    problem.click()  # the problem selects its node and shows its message there
    expect(page.get_by_label("Edit node")).to_have_value("state-2")
    expect(page.locator("#node-problems")).to_contain_text("S16: 'Review' has no assignees.")
    expect(page.locator("#node-name")).to_be_focused()
    assert canvas_has(page, "designer-canvas", "state-2", "problem")
    expect(page.get_by_role("button", name=re.compile("^Activate"))).to_be_hidden()

    # Fixed and saved again: valid, and activated.
    page.get_by_label("Assignee users").fill("uma")
    page.get_by_role("button", name="Save as a new version").click()
    expect(status).to_contain_text("Saved version 2, valid.")
    assert not canvas_has(page, "designer-canvas", "state-2", "problem")
    page.screenshot(path=screenshots / "designer.png", full_page=True)
    page.get_by_role("button", name="Activate version 2").click()
    expect(page.get_by_role("status")).to_have_text(
        "This version is active: new instances start on it."
    )
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"{name} v2")
    accessible(page)

    # An example claim submitted to it, then moved by its assignee's button.
    page.goto("/console/graphs")
    page.get_by_label("Workflow").select_option(name)
    page.get_by_label("Submitted on behalf of").fill("sam")
    page.get_by_role("button", name="Create an example expense claim and submit it").click()
    expect(page.get_by_role("status")).to_have_text("Submitted: the instance is running.")
    expect(page.locator(".branch h3")).to_have_text("Branch 1 on Review")
    page.get_by_label("Acting on behalf of").fill("uma")
    page.get_by_role("button", name="Act for this user").click()
    page.get_by_role("button", name="Finish").click()
    expect(page.get_by_role("status")).to_have_text("Done: the branch moved.")
    expect(page.get_by_role("heading", level=1)).to_contain_text("completed")
    expect(page.locator(".graph-history")).to_contain_text("Moved from 'Review' to 'Done'.")
    assert canvas_has(page, "diagram", "end-3", "visited")
    assert canvas_has(page, "diagram", "state-2->end-3", "trail")
    accessible(page)


def test_an_instance_is_drawn_with_its_branches_and_history(
    page: Page, screenshots: Path, accessible: Callable[[Page], None]
) -> None:
    claim = page.request.post(
        "/dev/expense-claims", data={"title": "Team offsite", "amount": 2400, "submitted_by": "sam"}
    ).json()
    submitted = page.request.post(
        "/graphs/instances",
        data={
            "subject_type": claim["subject_type"],
            "subject_key": claim["subject_key"],
            "workflow": claim["workflow"],
            "user": "sam",
        },
    )
    assert submitted.status == 201, submitted.text()
    page.goto(f"/console/graphs/instances/{submitted.json()['id']}?user=mia")
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("status")).to_have_text("Done: the branch moved.")
    expect(page.locator(".branch h3")).to_have_text(
        ["Branch 2 on Finance review", "Branch 3 on Legal review"]
    )
    expect(page.locator(".graph-history")).to_contain_text("Fork 'Finance and legal' started 2")
    for key in ("finance", "legal"):
        assert canvas_has(page, "diagram", key, "current")
    assert canvas_has(page, "diagram", "manager", "visited")
    assert canvas_has(page, "diagram", "signoff", "faded")
    page.get_by_role("link", name="fay").click()  # act as one of the finance group
    expect(page.get_by_role("button", name="Finance approves")).to_be_visible()
    page.screenshot(path=screenshots / "graph-instance.png", full_page=True)
    accessible(page)


def submit_claim(page: Page, amount: int) -> str:
    """A new example claim submitted to the expense graph by sam; the instance's id."""
    claim = page.request.post(
        "/dev/expense-claims", data={"title": "Taxi", "amount": amount, "submitted_by": "sam"}
    ).json()
    submitted = page.request.post(
        "/graphs/instances",
        data={
            "subject_type": claim["subject_type"],
            "subject_key": claim["subject_key"],
            "workflow": claim["workflow"],
            "user": "sam",
        },
    )
    assert submitted.status == 201, submitted.text()
    return str(submitted.json()["id"])


def move(page: Page, instance_id: str, user: str, name: str) -> None:
    """`user` takes the move called `name` through the JSON API (not the page)."""
    url = f"/graphs/instances/{instance_id}/transitions"
    [choice] = [
        c
        for c in page.request.get(url, params={"user": user}).json()["transitions"]
        if c["display_name"] == name
    ]
    moved = page.request.post(
        url,
        data={
            "branch_id": choice["branch_id"],
            "target_id": choice["target_id"],
            "user": user,
        },
    )
    assert moved.status == 200, moved.text()


def test_an_instance_page_follows_moves_made_elsewhere_and_keeps_a_form_being_filled(
    page: Page, accessible: Callable[[Page], None]
) -> None:
    instance_id = submit_claim(page, 80)
    move(page, instance_id, "mia", "Approve")
    page.goto(f"/console/graphs/instances/{instance_id}?user=fred")
    page.evaluate("window.notReloaded = true")
    finance = page.locator(".branch", has_text="Finance review")
    expect(finance.locator("ul.tally")).to_contain_text("Finance approves: 0 of 2")
    page.get_by_text("Cancel this instance").click()
    page.get_by_label("Reason").fill("a reason half typed")
    move(page, instance_id, "fay", "Finance approves")  # elsewhere: the page polls
    expect(finance.locator("ul.tally")).to_contain_text("Finance approves: 1 of 2 (fay)")
    expect(page.locator(".graph-history")).to_contain_text("fay voted to move")
    assert page.evaluate("window.notReloaded") is True, "the page was reloaded"
    expect(page.get_by_label("Reason")).to_have_value("a reason half typed")
    move(page, instance_id, "lee", "Legal approves")
    expect(page.locator(".branch h3")).to_have_text(["Branch 2 on Finance review"])
    assert canvas_has(page, "diagram", "legal", "visited")
    assert not canvas_has(page, "diagram", "legal", "current")
    expect(page.get_by_label("Reason")).to_have_value("a reason half typed")
    accessible(page)


def test_the_index_and_a_designer_copy_pass_axe(
    page: Page, accessible: Callable[[Page], None]
) -> None:
    page.goto("/console/graphs")
    expect(page.get_by_role("heading", name="Graph workflows")).to_be_visible()
    accessible(page)
    page.get_by_role("link", name="expense-approval v1", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("expense-approval v1")
    accessible(page)
    page.get_by_role("link", name="Edit a copy in the designer").click()
    expect(page.get_by_label("Name", exact=True)).to_have_value("expense-approval")
    expect(page.get_by_label("Edit node")).to_contain_text("Manager review (state)")
    accessible(page)
