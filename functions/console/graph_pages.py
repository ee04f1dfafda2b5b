"""The console's graph pages: templates drawn, instances moved by their buttons.

Pages read through the process's `GraphRuntime` and the request layer's reads; every form
is read into the request layer's model and done by its function (`functions.requests.graphs`),
as `POST /graphs/...` is. Forms carry the CSRF token. The logged-in principal acts and is
offered its own moves; with no credential configured (open mode, `LOCAL`) the pages keep an
"acting as" picker, whose user the principal acts for. The designer is `graph_designer`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.routing import NoMatchFound

from engine.base.errors import ConfigurationError, DulyError, NotFoundError
from engine.graphs.configure import get_graph_runtime
from engine.graphs.design.document import describe, design_matches, drawn_design
from engine.graphs.design.model import Graph, Node, load_graph
from engine.graphs.design.validation import validate_graph
from engine.graphs.design.versions import list_templates, load_design
from engine.graphs.moves.actors import Actor
from engine.graphs.moves.directory import effective_assignees
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.snapshots import AvailableTransition, BranchSnapshot
from engine.graphs.moves.subjects import subject_types
from engine.graphs.moves.votes import counts_votes, required_approvals
from functions.console.graph_diagrams import instance_marks, problem_json
from functions.console.rendering import ConsolePage, render
from functions.http.errors import message_of, status_of
from functions.identity.access import allow, principal_of
from functions.identity.principal import Principal, Role, Via
from functions.requests import graphs
from functions.requests.graphs import (
    CancelRequest,
    SubmitRequest,
    TransitionRequest,
    acting,
    recent_instances,
    stored_layout,
    visited_states,
    votes_at_current_visits,
)

# Pages: a client's mistake (an unknown instance, no graph runtime) is a page saying so.
router = APIRouter(prefix="/graphs", route_class=ConsolePage)

PAGES = "/console/graphs"
RECENT_INSTANCES = 50  # rows in the index's list of instances
# `duly dev`'s route that creates example subjects, by its endpoint's name (named, not
# imported: what deploys imports nothing of functions.local).
EXAMPLE_CLAIMS_ROUTE = "dev_create_expense_claim"
UserField = Annotated[str, Query(max_length=200)]
FINGERPRINT_LENGTH = 32  # hex digits of the live fragment's fingerprint
SeenField = Annotated[str, Query(max_length=FINGERPRINT_LENGTH)]
FormText = Annotated[str, Form()]

# What a redirect after a write says on the page it lands on (`?done=`).
NOTES = {
    "submitted": "Submitted: the instance is running.",
    "moved": "Done: the branch moved.",
    "voted": "Your vote is counted; the branch moves when the threshold is met.",
    "cancelled": "The instance is cancelled.",
    "activated": "This version is active: new instances start on it.",
}


# -- the index --------------------------------------------------------------------------------


@router.get("", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def graphs_index(request: Request, user: UserField = "") -> Response:
    """Templates by name with their versions, a submit form, and the recent instances."""
    return await _index_page(request, form={"user": picked(request, user)})


async def _index_page(
    request: Request,
    *,
    form: Mapping[str, str],
    error: str | None = None,
    status: int = 200,
) -> Response:
    runtime = get_graph_runtime()
    async with runtime.reading() as conn:
        versions = await list_templates(conn, runtime.tables)
        instances = await recent_instances(conn, runtime.tables, RECENT_INSTANCES)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for version in versions:
        by_name.setdefault(version["name"], []).append(version)
    context = {
        "title": "Graph workflows",
        "templates_by_name": by_name,
        "active_names": sorted(v["name"] for v in versions if v["is_active"]),
        "subject_types": subject_types(),
        "instances": instances,
        "form": form,
        "error": error,
        "picking": picks_who_acts(principal_of(request)),
        "example_claims": _route_path(request, EXAMPLE_CLAIMS_ROUTE),
    }
    return _page(request, "graphs/index.html", context, status=status)


@router.post("/instances", dependencies=[allow(Role.VIEWER)])
async def submit_instance(
    request: Request,
    subject_type: FormText,
    subject_key: FormText,
    workflow: FormText = "",
    user: FormText = "",
) -> Response:
    """Submit a subject, as `POST /graphs/instances` does; then its instance's page."""
    form = {"subject_type": subject_type, "subject_key": subject_key, "workflow": workflow}
    principal = principal_of(request)
    try:
        body = SubmitRequest(
            subject_type=subject_type,
            subject_key=subject_key,
            user=user or None,
            workflow=workflow or None,
        )
        runtime = get_graph_runtime()
        Session = request.app.state.Session
        instance = await graphs.submit_subject(runtime, Session, body, principal)
    except (DulyError, ValidationError) as exc:
        status, message = refusal(exc)
        shown = {**form, "user": picked(request, user)}
        return await _index_page(request, form=shown, error=message, status=status)
    path = f"{PAGES}/instances/{instance['id']}"
    return _redirect(path, user=picked(request, user), done="submitted")


# -- a template version -----------------------------------------------------------------------


@router.get(
    "/templates/{template_id}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)]
)
async def template_page(request: Request, template_id: uuid.UUID, done: str = "") -> Response:
    """One version drawn, its validation problems, and its activation."""
    return await _template_page(request, template_id, note=NOTES.get(done))


async def _template_page(
    request: Request,
    template_id: uuid.UUID,
    *,
    note: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    runtime = get_graph_runtime()
    async with runtime.reading() as conn:
        loaded = await load_design(conn, runtime.tables, template_id)
        graph = await load_graph(conn, runtime.tables, template_id)
        layout = await stored_layout(conn, runtime.tables, template_id)
        siblings = [
            v for v in await list_templates(conn, runtime.tables) if v["name"] == graph.name
        ]
    problems = [problem_json(p, graph) for p in validate_graph(graph, runtime.conditions.names())]
    diagram = {
        "nodes": loaded["nodes"],
        "connections": loaded["connections"],
        "preset": design_matches(layout, graph),
        "problems": problems,
    }
    context = {
        "title": f"{graph.name} v{graph.version}",
        "template": loaded,
        "graph": graph,
        "versions": siblings,
        "problems": problems,
        "diagram": diagram,
        "note": note,
        "error": error,
    }
    return _page(request, "graphs/template.html", context, status=status)


@router.post("/templates/{template_id}/activate", dependencies=[allow(Role.DESIGNER)])
async def activate_version(request: Request, template_id: uuid.UUID) -> Response:
    """Activate a version, as `POST /graphs/templates/{id}/activate` does."""
    try:
        await graphs.activate_version(get_graph_runtime(), template_id)
    except NotFoundError:
        raise  # no such version: the console's error page
    except DulyError as exc:
        status, message = refusal(exc)
        return await _template_page(request, template_id, error=message, status=status)
    return _redirect(f"{PAGES}/templates/{template_id}", done="activated")


# -- an instance ------------------------------------------------------------------------------


@router.get(
    "/instances/{instance_id}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)]
)
async def instance_page(
    request: Request, instance_id: uuid.UUID, user: UserField = "", done: str = ""
) -> Response:
    """An instance drawn on its version, its history, and the moves its viewer may make
    (in open mode, the moves of the `user` picked)."""
    return await _instance_page(request, instance_id, user=user, note=NOTES.get(done))


@router.get(
    "/instances/{instance_id}/live",
    response_class=HTMLResponse,
    dependencies=[allow(Role.VIEWER)],
)
async def instance_live(
    request: Request, instance_id: uuid.UUID, user: UserField = "", seen: SeenField = ""
) -> Response:
    """The part of the instance page that updates itself: 204 while it is as `seen` shows it,
    so a page left open is not redrawn (nor a form being filled touched) until a move."""
    context = await _instance_context(request, instance_id, user=user)
    if context["fingerprint"] == seen:
        return Response(status_code=204, headers={"Cache-Control": "no-store"})
    return _page(request, "graphs/instance_live.html", context)


async def _instance_page(
    request: Request,
    instance_id: uuid.UUID,
    *,
    user: str,
    note: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    context = await _instance_context(request, instance_id, user=user)
    return _page(
        request, "graphs/instance.html", {**context, "note": note, "error": error}, status=status
    )


async def _instance_context(
    request: Request, instance_id: uuid.UUID, *, user: str
) -> dict[str, Any]:
    """What the instance page shows, read now, and a fingerprint of it."""
    runtime = get_graph_runtime()
    principal = principal_of(request)
    picking = picks_who_acts(principal)
    user = picked(request, user)
    # Open mode offers nothing until a user is picked; else the principal's own moves.
    actor = acting(principal, user or None) if user or not picking else None
    snapshot = await runtime.instance(instance_id)
    entries = await runtime.history(instance_id)
    choices = await runtime.transitions_for(instance_id, actor) if actor is not None else []
    async with runtime.reading() as conn:
        graph = await load_graph(conn, runtime.tables, snapshot.template_id)
        layout = await stored_layout(conn, runtime.tables, snapshot.template_id)
        visits = await visited_states(conn, runtime.tables, instance_id)
        votes = await votes_at_current_visits(conn, runtime.tables, instance_id)
    drawn = drawn_design(layout, graph)
    diagram = {
        "nodes": drawn["nodes"],
        "connections": drawn["connections"],
        "preset": design_matches(layout, graph),
        **instance_marks(graph, snapshot.branches, entries, visits),
    }
    branches = await _branches(runtime, graph, snapshot.branches, choices, actor, votes)
    shown = (snapshot, entries, choices, branches, user, actor)
    return {
        "title": f"{snapshot.workflow} instance",
        "instance": snapshot,
        "history": entries,
        "user": user,
        "picking": picking,
        "acting": actor.shown if actor is not None else None,
        "branches": branches,
        "diagram": diagram,
        # What the page shows, summed up: the live fragment answers 204 while it is the same.
        "fingerprint": hashlib.sha256(repr(shown).encode()).hexdigest()[:FINGERPRINT_LENGTH],
        "live_url": f"{PAGES}/instances/{instance_id}/live",
    }


async def _branches(
    runtime: GraphRuntime,
    graph: Graph,
    branches: Sequence[BranchSnapshot],
    choices: Sequence[AvailableTransition],
    actor: Actor | None,
    votes: Mapping[uuid.UUID, Mapping[uuid.UUID, Sequence[str]]],
) -> list[dict[str, Any]]:
    """Each active branch with who may move it, the votes for each of its moves (where its
    state counts them), and the moves the acting user may make."""
    shown = []
    for branch in branches:
        node = graph.nodes.get(branch.node_id) if branch.node_id is not None else None
        people: list[str] = []
        if node is not None and node.has_assignees:
            people = await effective_assignees(
                runtime.directory, node.assignee_users, node.assignee_groups, actor
            )
        shown.append(
            {
                "branch": branch,
                "node": node,
                "assignees": people,
                "tally": _tally(graph, node, people, votes.get(branch.id, {})),
                "choices": [c for c in choices if c.branch_id == branch.id],
            }
        )
    return shown


def _tally(
    graph: Graph,
    node: Node | None,
    people: Sequence[str],
    cast: Mapping[uuid.UUID, Sequence[str]],
) -> list[dict[str, Any]]:
    """Each move out of a state that counts votes: its votes (of people who are assignees
    now, as the runtime counts them) and the votes it needs; [] for any other node."""
    if node is None or not counts_votes(node.approval_threshold):
        return []
    needed = required_approvals(node.approval_threshold, len(people))
    tally = []
    for edge in graph.outgoing(node.id):
        voters = [person for person in cast.get(edge.target_id, ()) if person in people]
        target = graph.nodes.get(edge.target_id)
        name = edge.label or (target.title if target is not None else "?")
        tally.append({"name": name, "voters": voters, "count": len(voters), "needed": needed})
    return tally


@router.post("/instances/{instance_id}/transitions", dependencies=[allow(Role.VIEWER)])
async def take_transition(
    request: Request,
    instance_id: uuid.UUID,
    branch_id: FormText,
    target_node_id: FormText,
    user: FormText = "",
    source_node_id: FormText = "",
    comment: FormText = "",
) -> Response:
    """Take a transition, as `POST /graphs/instances/{id}/transitions` does."""
    try:
        body = TransitionRequest.model_validate(
            {
                "branch_id": branch_id,
                "target_node_id": target_node_id,
                "user": user or None,
                "comment": comment,
                "source_node_id": source_node_id or None,
            }
        )
        principal = principal_of(request)
        outcome = await graphs.take_transition(get_graph_runtime(), instance_id, body, principal)
    except NotFoundError:
        raise  # no such instance: the console's error page
    except (DulyError, ValidationError) as exc:
        status, message = refusal(exc)
        return await _instance_page(request, instance_id, user=user, error=message, status=status)
    done = "moved" if outcome["moved"] else "voted"
    return _redirect(f"{PAGES}/instances/{instance_id}", user=picked(request, user), done=done)


@router.post("/instances/{instance_id}/cancel", dependencies=[allow(Role.OPERATOR)])
async def cancel_instance(
    request: Request, instance_id: uuid.UUID, user: FormText = "", reason: FormText = ""
) -> Response:
    """Cancel an instance, as `POST /graphs/instances/{id}/cancel` does."""
    try:
        body = CancelRequest(user=user or None, reason=reason)
        principal = principal_of(request)
        await graphs.cancel_instance(get_graph_runtime(), instance_id, body, principal)
    except NotFoundError:
        raise  # no such instance: the console's error page
    except (DulyError, ValidationError) as exc:
        status, message = refusal(exc)
        return await _instance_page(request, instance_id, user=user, error=message, status=status)
    path = f"{PAGES}/instances/{instance_id}"
    return _redirect(path, user=picked(request, user), done="cancelled")


# -- helpers ----------------------------------------------------------------------------------


def picks_who_acts(principal: Principal) -> bool:
    """Whether the pages offer the "acting as" picker: only with no credential configured."""
    return principal.via == Via.OPEN


def picked(request: Request, user: str) -> str:
    """The user the picker names, kept across pages in open mode; "" once a credential is."""
    return user if picks_who_acts(principal_of(request)) else ""


def refusal(exc: DulyError | ValidationError) -> tuple[int, str]:
    """The status and sentence a refused write answers with, as the JSON API's would."""
    if isinstance(exc, ValidationError):
        return 422, f"The form is not valid: {describe(exc)}."
    if isinstance(exc, ConfigurationError):
        raise exc  # the deployment's mistake, not the form's: a logged 500
    return status_of(exc), message_of(exc)


def _page(
    request: Request, name: str, context: dict[str, Any], *, status: int = 200
) -> HTMLResponse:
    return render(request, name, context, status_code=status)


def _redirect(path: str, **query: str) -> RedirectResponse:
    given = {key: value for key, value in query.items() if value}
    return RedirectResponse(f"{path}?{urlencode(given)}" if given else path, status_code=303)


def _route_path(request: Request, name: str) -> str | None:
    """The path of the app's route named `name`; None when the app has no such route."""
    try:
        return str(request.app.url_path_for(name))
    except NoMatchFound:
        return None
