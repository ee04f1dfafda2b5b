"""The console's graph pages: the index, an instance submitted, templates drawn and activated.

Pages read through the process's `GraphRuntime` and the request layer's reads; every form
is read into the request layer's model and done by its function (`functions.requests.graphs`),
as `POST /graphs/...` is. Forms carry the CSRF token. The logged-in principal acts; with no
credential configured (open mode, `LOCAL`) the pages keep an "acting as" picker, whose user
the principal acts for. One instance's page is `graph_instance_pages` (sharing the helpers
at the end); the designer is `graph_designer`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.routing import NoMatchFound

from engine import (
    ConfigurationError,
    DulyError,
    NotFoundError,
    describe_design_error,
    design_matches,
    get_graph_runtime,
    list_templates,
    load_design,
    load_graph,
    subject_types,
    validate_graph,
)
from functions.console.graph_diagrams import problem_json
from functions.console.rendering import ConsolePage, render
from functions.http.errors import message_of, status_of
from functions.identity.access import allow, principal_of
from functions.identity.principal import Principal, Role, Via
from functions.requests import graphs
from functions.requests.graphs import (
    SubmitRequest,
    recent_instances,
    stored_layout,
)

# Pages: a client's mistake (an unknown instance, no graph runtime) is a page saying so.
router = APIRouter(prefix="/graphs", route_class=ConsolePage)

PAGES = "/console/graphs"
RECENT_INSTANCES = 50  # rows in the index's list of instances
# `duly dev`'s route that creates example subjects, by its endpoint's name (named, not
# imported: what deploys imports nothing of functions.local).
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
    return page(request, "graphs/index.html", context, status=status)


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
    return redirect_to(path, user=picked(request, user), done="submitted")


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
    return page(request, "graphs/template.html", context, status=status)


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
    return redirect_to(f"{PAGES}/templates/{template_id}", done="activated")


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
        return 422, f"The form is not valid: {describe_design_error(exc)}."
    if isinstance(exc, ConfigurationError):
        raise exc  # the deployment's mistake, not the form's: a logged 500
    return status_of(exc), message_of(exc)


def page(
    request: Request, name: str, context: dict[str, Any], *, status: int = 200
) -> HTMLResponse:
    """A graph page: its template rendered with `context`, with its status."""
    return render(request, name, context, status_code=status)


def redirect_to(path: str, **query: str) -> RedirectResponse:
    """Post/Redirect/Get: a 303 to `path` with the query's non-empty values."""
    given = {key: value for key, value in query.items() if value}
    return RedirectResponse(f"{path}?{urlencode(given)}" if given else path, status_code=303)


def _route_path(request: Request, name: str) -> str | None:
    """The path of the app's route named `name`; None when the app has no such route."""
    try:
        return str(request.app.url_path_for(name))
    except NoMatchFound:
        return None
