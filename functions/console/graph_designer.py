"""The console's graph designer: a new template or a copy of a version, and its save.

The designer posts its JSON with fetch to `designer/save`, which saves
through the request layer's `save_version` as `POST /graphs/templates` does, and says which
node or edge each validation problem names; its refusals are JSON too
(422, 400, 404), since a script reads them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from engine import (
    ANY_SUBMITTER,
    SUBMITTERS,
    GraphRuntime,
    design_matches,
    get_graph_runtime,
    load_design,
    load_graph,
)
from functions.console.graph_diagrams import problem_json
from functions.console.rendering import ConsolePage, render
from functions.identity.access import allow
from functions.identity.principal import Role
from functions.requests.graphs import save_version, stored_layout
from functions.requests.nesting import DesignBody

PAGES = "/console/graphs"
# Pages: a client's mistake (an unknown version, no graph runtime) is a page saying so.
router = APIRouter(prefix="/graphs", route_class=ConsolePage)
# The designer's save answers the designer's fetch in JSON, refusals too (422, 400, 404).
designer_api = APIRouter()


@router.get("/designer", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def new_design(request: Request) -> Response:
    """The designer on an empty template."""
    runtime = get_graph_runtime()
    blank = {
        "name": "",
        "description": "",
        "stateChoices": [],
        "forbidSelfApproval": False,
        "submitters": ANY_SUBMITTER,
        "nodes": [],
        "connections": [],
    }
    return _designer(request, runtime, blank, preset=True, based_on=None)


@router.get(
    "/designer/{template_id}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)]
)
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
        "forbidSelfApproval": loaded["forbid_self_approval"],
        "submitters": loaded["submitters"],
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
    context = {
        "title": "Designer",
        "data": data,
        "based_on": based_on,
        "submitter_rules": SUBMITTERS,
    }
    return render(request, "graphs/designer.html", context)


@designer_api.post("/designer/save", dependencies=[allow(Role.DESIGNER)])
async def save_from_designer(design: DesignBody) -> dict[str, Any]:
    """Save the designer's JSON as a new inactive version, as `POST /graphs/templates` does.

    The API's response, plus each problem with the node (and edge) it names,
    and the new version's page and activation URLs.
    """
    saved = await save_version(get_graph_runtime(), design)
    version_url = f"{PAGES}/templates/{saved.template_id}"
    return {
        **saved.response(),
        "problems": [problem_json(problem, saved.graph) for problem in saved.problems],
        "template_url": version_url,
        "activate_url": f"{version_url}/activate",
    }


router.include_router(designer_api)
