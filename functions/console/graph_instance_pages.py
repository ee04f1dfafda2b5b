"""The console's page of one graph instance: drawn on its version, moved by its buttons, live.

The page is a shell around a fragment that asks for itself every 2 s while the tab is
visible (`/live`), answered 204 until what it shows has changed; each branch on a state
that counts votes shows every move's tally against its threshold. Moves and the cancel
are read into the request layer's model and done by its function, as `POST /graphs/...`
is; the helpers they share with the other graph pages are `graph_pages`'.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError

from engine import (
    Actor,
    AvailableTransition,
    BranchSnapshot,
    CastVotes,
    DulyError,
    Graph,
    GraphRuntime,
    Node,
    NotFoundError,
    admitted,
    counted_voters,
    counts_votes,
    current_votes,
    design_matches,
    drawn_design,
    effective_assignees,
    get_graph_runtime,
    load_graph,
    required_approvals,
)
from functions.console.graph_diagrams import instance_marks
from functions.console.graph_pages import (
    NOTES,
    PAGES,
    FormText,
    UserField,
    page,
    picked,
    picks_who_acts,
    redirect_to,
    refusal,
)
from functions.console.rendering import ConsolePage
from functions.identity.access import allow, principal_of
from functions.identity.principal import Role
from functions.requests import graphs
from functions.requests.graphs import (
    CancelRequest,
    TransitionRequest,
    acting,
    stored_layout,
    visited_states,
)

router = APIRouter(prefix="/graphs", route_class=ConsolePage)

FINGERPRINT_LENGTH = 32  # hex digits of the live fragment's fingerprint
SeenField = Annotated[str, Query(max_length=FINGERPRINT_LENGTH)]


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
    return page(request, "graphs/instance_live.html", context)


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
    return page(
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
        votes = await current_votes(conn, runtime.tables, instance_id)
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
    votes: CastVotes,
) -> list[dict[str, Any]]:
    """Each active branch with who may move it, the votes for each of its moves (where its
    state counts them), and the moves the acting user may make."""
    shown = []
    for branch in branches:
        node = graph.nodes.get(branch.node_id) if branch.node_id is not None else None
        listed: list[str] = []
        if node is not None and node.has_assignees:
            listed = await effective_assignees(
                runtime.directory, node.assignee_users, node.assignee_groups
            )
        cast = votes.get(branch.id, {})
        shown.append(
            {
                "branch": branch,
                "node": node,
                "assignees": admitted(listed, node.assignee_groups if node else (), actor),
                "listed": len(listed),  # whom the threshold counts, whoever looks
                "voted": actor is not None
                and any(voter == actor.user for pairs in cast.values() for voter, _ in pairs),
                "tally": _tally(graph, node, listed, cast),
                "choices": [c for c in choices if c.branch_id == branch.id],
            }
        )
    return shown


def _tally(
    graph: Graph,
    node: Node | None,
    listed: Sequence[str],
    cast: Mapping[uuid.UUID, Sequence[tuple[str, bool]]],
) -> list[dict[str, Any]]:
    """Each move out of a state that counts votes: its votes and the votes it needs, as the
    runtime counts them (the directory's assignees, whoever looks); [] for any other node."""
    if node is None or not counts_votes(node.approval_threshold):
        return []
    needed = required_approvals(node.approval_threshold, len(listed))
    tally = []
    for edge in graph.outgoing(node.id):
        voters = counted_voters(cast.get(edge.target_id, ()), listed)
        target = graph.nodes.get(edge.target_id)
        name = edge.label or (target.title if target is not None else "?")
        tally.append({"name": name, "voters": voters, "count": len(voters), "needed": needed})
    return tally


@router.post("/instances/{instance_id}/transitions", dependencies=[allow(Role.VIEWER)])
async def take_transition(
    request: Request,
    instance_id: uuid.UUID,
    branch_id: FormText,
    target_id: FormText,
    user: FormText = "",
    source_node_id: FormText = "",
    comment: FormText = "",
) -> Response:
    """Take a transition, as `POST /graphs/instances/{id}/transitions` does."""
    try:
        body = TransitionRequest.model_validate(
            {
                "branch_id": branch_id,
                "target_id": target_id,
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
    return redirect_to(f"{PAGES}/instances/{instance_id}", user=picked(request, user), done=done)


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
    return redirect_to(path, user=picked(request, user), done="cancelled")
