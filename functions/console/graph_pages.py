"""The console's graph pages: templates drawn, instances moved by their buttons, the designer.

Pages read through the process's `GraphRuntime` and the version functions
the JSON API uses (`engine.graphs.design.versions`). Every form calls the JSON
API's own route function (`functions.graph_routes`) with the same request
model, so a form is checked and refused exactly as the API would, then
answers with a redirect (Post/Redirect/Get) or with the page again and the
refusal. The designer posts its JSON with fetch to `designer/save`, which
saves through `save_design` as `POST /graphs/templates` does and also says
which node or edge each validation problem names.

Writes are guarded before they reach these routes: the app's `WriteGuard`
checks the console's session and CSRF token (`functions.console.auth`),
which every form here carries as a hidden field and the designer's fetch
as the `X-CSRF-Token` header. Who acts is the `user` field ("acting as"):
duly's user ids are opaque, and the console's login says that someone may
operate the console, not who they are in the application's directory.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.routing import NoMatchFound

from engine.errors import DulyError, NotFoundError, WorkflowTransitionError
from engine.graphs.configure import get_graph_runtime
from engine.graphs.design.document import Design, describe, design_matches, drawn_design
from engine.graphs.design.model import Graph, load_graph
from engine.graphs.design.problems import Problem
from engine.graphs.design.validation import validate_graph
from engine.graphs.design.versions import list_templates, load_design, save_design
from engine.graphs.moves.directory import effective_assignees
from engine.graphs.moves.history import HistoryEntry
from engine.graphs.moves.runtime import GraphRuntime
from engine.graphs.moves.snapshots import AvailableTransition, BranchSnapshot
from engine.graphs.moves.subjects import subject_types
from engine.graphs.tables import ASSIGNMENT, CONDITION, STATUS_CHANGE, GraphTables
from functions import graph_routes
from functions.console.rendering import ConsolePage, render

# Pages: a client's mistake (an unknown instance, no graph runtime) is a page saying so.
router = APIRouter(prefix="/graphs", route_class=ConsolePage)
# The designer's save answers the designer's fetch in JSON, refusals too (422, 400, 404).
designer_api = APIRouter()

PAGES = "/console/graphs"
RECENT_INSTANCES = 50  # rows in the index's list of instances
# `duly dev`'s route that creates example subjects, by its endpoint's name (named, not
# imported: what deploys imports nothing of functions.dev).
EXAMPLE_CLAIMS_ROUTE = "dev_create_expense_claim"
UserField = Annotated[str, Query(max_length=200)]
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


@router.get("", response_class=HTMLResponse)
async def graphs_index(request: Request, user: UserField = "") -> Response:
    """Templates by name with their versions, a submit form, and the recent instances."""
    return await _index_page(request, form={"user": user})


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
        instances = await recent_instances(conn, runtime.tables)
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
        "example_claims": _route_path(request, EXAMPLE_CLAIMS_ROUTE),
    }
    return _page(request, "graphs/index.html", context, status=status)


async def recent_instances(conn: AsyncConnection, tables: GraphTables) -> list[dict[str, Any]]:
    """The newest instances with their template's name and version."""
    instances, versions = tables.table("instance"), tables.table("template")
    rows = await conn.execute(
        select(
            instances.c.id,
            instances.c.subject_type,
            instances.c.subject_key,
            instances.c.state_status,
            instances.c.state_code,
            instances.c.submitted_by,
            instances.c.submitted_at,
            versions.c.name,
            versions.c.version,
        )
        .join(versions, versions.c.id == instances.c.template_id)
        .order_by(instances.c.submitted_at.desc(), instances.c.id)
        .limit(RECENT_INSTANCES)
    )
    return [dict(row._mapping) for row in rows]


@router.post("/instances")
async def submit_instance(
    request: Request,
    subject_type: FormText,
    subject_key: FormText,
    workflow: FormText = "",
    user: FormText = "",
) -> Response:
    """Submit a subject, as `POST /graphs/instances` does; then its instance's page."""
    form = {"subject_type": subject_type, "subject_key": subject_key, "workflow": workflow}
    try:
        body = graph_routes.SubmitRequest(
            subject_type=subject_type,
            subject_key=subject_key,
            user=user or None,
            workflow=workflow or None,
        )
        instance = await graph_routes.submit_subject(request, body)
    except (DulyError, ValidationError) as exc:
        status, message = refusal(exc)
        return await _index_page(request, form={**form, "user": user}, error=message, status=status)
    return _redirect(f"{PAGES}/instances/{instance['id']}", user=user, done="submitted")


# -- a template version -----------------------------------------------------------------------


@router.get("/templates/{template_id}", response_class=HTMLResponse)
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


async def stored_layout(
    conn: AsyncConnection, tables: GraphTables, template_id: uuid.UUID
) -> dict[str, Any]:
    """The designer JSON saved with a version: drawn as it is only while it matches."""
    versions = tables.table("template")
    design = (
        await conn.execute(select(versions.c.design).where(versions.c.id == template_id))
    ).scalar_one_or_none()
    return dict(design or {})


@router.post("/templates/{template_id}/activate")
async def activate_version(request: Request, template_id: uuid.UUID) -> Response:
    """Activate a version, as `POST /graphs/templates/{id}/activate` does."""
    try:
        await graph_routes.activate_graph_template(template_id)
    except NotFoundError:
        raise  # no such version: the console's error page
    except DulyError as exc:
        status, message = refusal(exc)
        return await _template_page(request, template_id, error=message, status=status)
    return _redirect(f"{PAGES}/templates/{template_id}", done="activated")


# -- an instance ------------------------------------------------------------------------------


@router.get("/instances/{instance_id}", response_class=HTMLResponse)
async def instance_page(
    request: Request, instance_id: uuid.UUID, user: UserField = "", done: str = ""
) -> Response:
    """An instance drawn on its version, its history, and the moves `user` may make."""
    return await _instance_page(request, instance_id, user=user, note=NOTES.get(done))


async def _instance_page(
    request: Request,
    instance_id: uuid.UUID,
    *,
    user: str,
    note: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    runtime = get_graph_runtime()
    snapshot = await runtime.instance(instance_id)
    entries = await runtime.history(instance_id)
    choices = await runtime.transitions_for(instance_id, user) if user else []
    async with runtime.reading() as conn:
        graph = await load_graph(conn, runtime.tables, snapshot.template_id)
        layout = await stored_layout(conn, runtime.tables, snapshot.template_id)
        visits = await visited_states(conn, runtime.tables, instance_id)
    drawn = drawn_design(layout, graph)
    diagram = {
        "nodes": drawn["nodes"],
        "connections": drawn["connections"],
        "preset": design_matches(layout, graph),
        **instance_marks(graph, snapshot.branches, entries, visits),
    }
    context = {
        "title": f"{snapshot.workflow} instance",
        "instance": snapshot,
        "history": entries,
        "user": user,
        "branches": await _branches(runtime, graph, snapshot.branches, choices),
        "diagram": diagram,
        "note": note,
        "error": error,
    }
    return _page(request, "graphs/instance.html", context, status=status)


async def visited_states(
    conn: AsyncConnection, tables: GraphTables, instance_id: uuid.UUID
) -> dict[uuid.UUID, uuid.UUID]:
    """Each visit of the instance and the state it entered (visit id to node id)."""
    visits = tables.table("visit")
    rows = await conn.execute(
        select(visits.c.id, visits.c.node_id).where(visits.c.instance_id == instance_id)
    )
    return {row.id: row.node_id for row in rows}


def instance_marks(
    graph: Graph,
    branches: Sequence[BranchSnapshot],
    history: Sequence[HistoryEntry],
    visits: Mapping[uuid.UUID, uuid.UUID],
) -> dict[str, Any]:
    """What the diagram marks: where each active branch stands, what was visited, which
    edges were taken (by node keys).

    The edges come from the audit trail, whose metadata names them: a move or an
    escalation names its visit (whose node is the source) and its target; a fork
    takes all its edges; a join's continuation its one edge; a condition names its
    result (and, by its title, itself).
    """
    taken: set[tuple[uuid.UUID, uuid.UUID]] = set()
    start = graph.start
    if start is not None and history:
        taken.update((start.id, edge.target_id) for edge in graph.outgoing(start.id))
    for entry in history:
        taken.update(_edges_of(graph, entry, visits))
    visited = {node_id for pair in taken for node_id in pair} | set(visits.values())
    current: dict[str, list[int]] = {}
    for branch in branches:
        if branch.node_key is not None:
            current.setdefault(branch.node_key, []).append(branch.number)
    return {
        "visited": sorted(graph.node(node_id).key for node_id in visited if node_id in graph.nodes),
        "current": current,
        "trail": sorted(
            [graph.node(source).key, graph.node(target).key]
            for source, target in taken
            if source in graph.nodes and target in graph.nodes
        ),
    }


def _edges_of(
    graph: Graph, entry: HistoryEntry, visits: Mapping[uuid.UUID, uuid.UUID]
) -> set[tuple[uuid.UUID, uuid.UUID]]:
    """The edges one history row says were taken."""
    meta = entry.metadata
    if entry.action_type == ASSIGNMENT and meta.get("targets") and meta.get("fork_node"):
        fork = _uuid(meta["fork_node"])  # a fork starts a branch on each of its edges
        return {(e.source_id, e.target_id) for e in graph.outgoing(fork)} if fork else set()
    if entry.action_type != STATUS_CHANGE:
        return set()
    target = _uuid(meta.get("target_state_id"))
    if target is not None and entry.visit_id is not None and entry.visit_id in visits:
        return {(visits[entry.visit_id], target)}
    if meta.get("join_node") and meta.get("to_state"):
        join = _uuid(meta["join_node"])
        return {(e.source_id, e.target_id) for e in graph.outgoing(join)} if join else set()
    if "condition" in meta and "result" in meta:
        wanted = "true" if meta["result"] else "false"
        return {
            (edge.source_id, edge.target_id)
            for node in graph.nodes.values()
            if node.node_type == CONDITION and node.title == entry.step_name
            for edge in graph.outgoing(node.id)
            if edge.condition_result == wanted
        }
    return set()


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None


async def _branches(
    runtime: GraphRuntime,
    graph: Graph,
    branches: Sequence[BranchSnapshot],
    choices: Sequence[AvailableTransition],
) -> list[dict[str, Any]]:
    """Each active branch with who may move it and the moves the acting user may make."""
    shown = []
    for branch in branches:
        node = graph.nodes.get(branch.node_id) if branch.node_id is not None else None
        people: list[str] = []
        if node is not None and node.has_assignees:
            people = await effective_assignees(
                runtime.directory, node.assignee_users, node.assignee_groups
            )
        shown.append(
            {
                "branch": branch,
                "node": node,
                "assignees": people,
                "choices": [c for c in choices if c.branch_id == branch.id],
            }
        )
    return shown


@router.post("/instances/{instance_id}/transitions")
async def take_transition(
    request: Request,
    instance_id: uuid.UUID,
    branch_id: FormText,
    target_node_id: FormText,
    user: FormText,
    source_node_id: FormText = "",
    comment: FormText = "",
) -> Response:
    """Take a transition, as `POST /graphs/instances/{id}/transitions` does."""
    try:
        body = graph_routes.TransitionRequest.model_validate(
            {
                "branch_id": branch_id,
                "target_node_id": target_node_id,
                "user": user,
                "comment": comment,
                "source_node_id": source_node_id or None,
            }
        )
        outcome = await graph_routes.transition(instance_id, body)
    except NotFoundError:
        raise  # no such instance: the console's error page
    except (DulyError, ValidationError) as exc:
        status, message = refusal(exc)
        return await _instance_page(request, instance_id, user=user, error=message, status=status)
    done = "moved" if outcome["moved"] else "voted"
    return _redirect(f"{PAGES}/instances/{instance_id}", user=user, done=done)


@router.post("/instances/{instance_id}/cancel")
async def cancel_instance(
    request: Request, instance_id: uuid.UUID, user: FormText = "", reason: FormText = ""
) -> Response:
    """Cancel an instance, as `POST /graphs/instances/{id}/cancel` does."""
    try:
        body = graph_routes.CancelRequest(user=user or None, reason=reason)
        await graph_routes.cancel_instance(instance_id, body)
    except NotFoundError:
        raise  # no such instance: the console's error page
    except (DulyError, ValidationError) as exc:
        status, message = refusal(exc)
        return await _instance_page(request, instance_id, user=user, error=message, status=status)
    return _redirect(f"{PAGES}/instances/{instance_id}", user=user, done="cancelled")


# -- the designer -----------------------------------------------------------------------------


@router.get("/designer", response_class=HTMLResponse)
async def new_design(request: Request) -> Response:
    """The designer on an empty template."""
    runtime = get_graph_runtime()
    blank = {"name": "", "description": "", "stateChoices": [], "nodes": [], "connections": []}
    return _designer(request, runtime, blank, preset=True, based_on=None)


@router.get("/designer/{template_id}", response_class=HTMLResponse)
async def edit_design(request: Request, template_id: uuid.UUID) -> Response:
    """The designer on a copy of one version: saving makes a new version of its name."""
    runtime = get_graph_runtime()
    async with runtime.reading() as conn:
        loaded = await load_design(conn, runtime.tables, template_id)
        graph = await load_graph(conn, runtime.tables, template_id)
        layout = await stored_layout(conn, runtime.tables, template_id)
    design = {
        "name": loaded["name"],
        "description": loaded["description"],
        "stateChoices": loaded["state_choices"],
        "baseTemplateId": loaded["template_id"],
        "nodes": loaded["nodes"],
        "connections": loaded["connections"],
    }
    return _designer(
        request, runtime, design, preset=design_matches(layout, graph), based_on=loaded
    )


def _designer(
    request: Request,
    runtime: GraphRuntime,
    design: dict[str, Any],
    *,
    preset: bool,
    based_on: Mapping[str, Any] | None,
) -> Response:
    data = {
        "design": design,
        "preset": preset,
        "conditions": sorted(runtime.conditions.names()),
        "saveUrl": f"{PAGES}/designer/save",
    }
    context = {"title": "Designer", "data": data, "based_on": based_on}
    return _page(request, "graphs/designer.html", context)


@designer_api.post("/designer/save")
async def save_from_designer(design: Design) -> dict[str, Any]:
    """Save the designer's JSON as a new inactive version, as `POST /graphs/templates` does.

    The seed's response, plus each problem with the node (and edge) it names,
    and the new version's page and activation URLs.
    """
    runtime = get_graph_runtime()
    async with runtime.engine.begin() as conn:
        saved = await save_design(conn, runtime.tables, design, runtime.conditions.names())
    version_url = f"{PAGES}/templates/{saved.template_id}"
    return {
        **saved.response(),
        "problems": [problem_json(problem, saved.graph) for problem in saved.problems],
        "template_url": version_url,
        "activate_url": f"{version_url}/activate",
    }


router.include_router(designer_api)


def problem_json(problem: Problem, graph: Graph) -> dict[str, Any]:
    """A validation problem as the pages mark it: its code, message, node key and edge."""
    edge = problem_edge(problem, graph)
    return {
        "code": problem.code,
        "message": str(problem),
        "node": problem.node_key,
        "edge": None if edge is None else {"source": edge[0], "target": edge[1]},
    }


def problem_edge(problem: Problem, graph: Graph) -> tuple[str, str] | None:
    """The (source, target) keys of the edge a problem is about, if it is about one.

    A problem names its node; when it is about one of that node's edges, its
    message names the edge as validation words it ("The transition from 'A'
    to 'B'", "The branch of 'F' to 'B'", "'Start' leads to 'B'").
    """
    source = graph.by_key(problem.node_key) if problem.node_key is not None else None
    if source is None:
        return None
    for edge in graph.outgoing(source.id):
        target = graph.node(edge.target_id)
        pair = f"{source.title!r} to {target.title!r}"
        phrases = (
            f"The transition from {pair}",
            f"The branch of {pair}",
            f"{source.title!r} leads to {target.title!r}",
        )
        if any(phrase in problem.message for phrase in phrases):
            return source.key, target.key
    return None


# -- helpers ----------------------------------------------------------------------------------


def refusal(exc: DulyError | ValidationError) -> tuple[int, str]:
    """The status and sentence a refused write answers with, as the JSON API's would."""
    if isinstance(exc, ValidationError):
        return 422, f"The form is not valid: {describe(exc)}."
    if isinstance(exc, NotFoundError):
        return 404, str(exc)
    if isinstance(exc, WorkflowTransitionError):
        return exc.http_status, str(exc)
    return 400, str(exc)


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
