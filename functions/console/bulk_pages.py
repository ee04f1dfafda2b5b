"""Acting on many runs from the console, `/console/bulk/{workflow}`: a form, a dry run to
confirm, then a progress page that posts on (htmx) until every batch is done.

The form's values become the request layer's `BulkRunsRequest` (`functions.requests.bulk`),
so the console is refused as the API is and records the same audit trail, its door
`console`. A page without scripts shows a button to go on instead.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from engine import RUN_STATES, DulyError, WorkflowInfo
from functions.console.rendering import ConsolePage, connection_of, render
from functions.identity.access import allow
from functions.identity.actors import console_actor
from functions.identity.principal import Role
from functions.requests import bulk
from functions.requests.bulk import BulkRunsRequest
from functions.requests.errors import ConflictError, from_validation, problems_of
from functions.requests.lookup import find_writable

router = APIRouter(prefix="/bulk", route_class=ConsolePage)

ACTIONS = {
    "retry": "Retry (run a step again on the failed runs)",
    "run": "Run a step now",
    "cancel": "Cancel",
}
FILTERS = ("q", "state", "step", "key", "error")
MAX_FIELD = 4000  # characters of one form value


def bulk_url(workflow: str) -> str:
    """The console's bulk form of a workflow."""
    return f"/console/bulk/{quote(workflow, safe='')}"


@router.get("/{workflow}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def bulk_form(
    request: Request,
    workflow: str,
    state: Annotated[str | None, Query(max_length=100)] = None,
    step: Annotated[str | None, Query(max_length=200)] = None,
    key: Annotated[str | None, Query(max_length=1000)] = None,
    error: Annotated[str | None, Query(max_length=1000)] = None,
    q: Annotated[str | None, Query(max_length=1000)] = None,
) -> HTMLResponse:
    """The form: which runs (the runs page's filter), and what to do to them."""
    info = find_writable(connection_of(request), workflow)
    given = {"q": q, "state": state, "step": step, "key": key, "error": error}
    typed = {f"filter.{name}": value or "" for name, value in given.items()}
    if state == "failed":
        typed["action"] = "retry"
    return _form_page(request, info, typed, [])


@router.post("/{workflow}", response_model=None, dependencies=[allow(Role.OPERATOR)])
async def bulk_post(request: Request, workflow: str) -> HTMLResponse:
    """A dry run and its confirmation; once confirmed, a batch of the apply and its progress."""
    info = find_writable(connection_of(request), workflow)
    form = await request.form()
    typed = {name: str(value)[:MAX_FIELD] for name, value in form.items() if name in _fields()}
    confirmed = form.get("confirmed") == "yes"
    try:
        body = _request_of(typed, confirmed)
        answer = await bulk.bulk_runs(
            connection_of(request), info, body, console_actor(request), budget=bulk.BUDGET
        )
    except DulyError as exc:
        status = 409 if isinstance(exc, ConflictError) else 400
        return _form_page(request, info, typed, _messages(exc), status)
    if answer.get("dry_run"):
        return _confirm_page(request, info, typed, answer)
    context = _progress_context(info, typed, answer)
    if request.headers.get("HX-Request") == "true":  # htmx posting on: the part that moves
        return render(request, "runs/bulk_progress_live.html", context)
    return render(request, "runs/bulk_progress.html", context)


def _fields() -> set[str]:
    return {"action", "step", "args", "expected", "upto", "next"} | {
        f"filter.{name}" for name in FILTERS
    }


def _request_of(typed: dict[str, str], confirmed: bool) -> BulkRunsRequest:
    """The form's values as the request layer's body; an InputError placing what is wrong."""
    action = typed.get("action", "")
    body: dict[str, Any] = {
        "action": action,
        "filter": {name: typed.get(f"filter.{name}") or None for name in FILTERS},
    }
    if action != "cancel":
        body["step"] = typed.get("step") or None
        try:
            body["args"] = json.loads(typed.get("args") or "{}")
        except ValueError:
            body["args"] = "not JSON"  # refused by the model, placed under args
    if confirmed:
        if typed.get("next"):
            body["next"] = typed["next"]
        else:
            body["expected"] = _number(typed.get("expected"))
            body["upto"] = typed.get("upto") or None
    try:
        return BulkRunsRequest.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc) from None


def _number(text: str | None) -> Any:
    try:
        return int(text or "")
    except ValueError:
        return text


def _messages(exc: DulyError) -> list[str]:
    problems = problems_of(exc)
    if problems is None:
        return [str(exc)]
    return [problem.sentence() for problem in problems]


def _form_page(
    request: Request,
    info: WorkflowInfo,
    typed: dict[str, str],
    general: list[str],
    status_code: int = 200,
) -> HTMLResponse:
    context = {
        "title": f"Act on many {info.name} runs",
        "info": info,
        "states": RUN_STATES,
        "steps": list(info.steps),
        "actions": ACTIONS,
        "typed": typed,
        "general": general,
        "post_url": bulk_url(info.name),
        "runs_url": _runs_url(info, typed),
    }
    return render(request, "runs/bulk_form.html", context, status_code=status_code)


def _confirm_page(
    request: Request, info: WorkflowInfo, typed: dict[str, str], answer: dict[str, Any]
) -> HTMLResponse:
    expected, held = answer["expected"], answer["held"]
    action = typed.get("action", "")
    what = {
        "retry": f"run {typed.get('step')} again on",
        "run": f"run {typed.get('step')} now on",
        "cancel": "cancel",
    }[action]
    question = (
        f"{expected:,} {info.name} run(s) match: {what} them? "
        f"{held:,} held by a worker now would be skipped. Runs started from now on are not "
        "touched."
    )
    hidden = {name: value for name, value in typed.items() if name not in ("expected", "upto")}
    hidden |= {"expected": str(expected), "upto": answer["upto"] or ""}
    context = {
        "title": "Confirm",
        "info": info,
        "question": question,
        "expected": expected,
        "hidden": hidden,
        "post_url": bulk_url(info.name),
        "back_url": bulk_url(info.name) + "?" + urlencode(_filter_query(typed)),
    }
    return render(request, "runs/bulk_confirm.html", context)


def _progress_context(
    info: WorkflowInfo, typed: dict[str, str], answer: dict[str, Any]
) -> dict[str, Any]:
    hidden = {n: v for n, v in typed.items() if n not in ("expected", "upto", "next")}
    if answer["next"] is not None:
        hidden |= {"next": answer["next"]}
    return {
        "title": f"{ACTIONS[typed['action']].split(' (')[0]}: {info.name}",
        "info": info,
        "progress": answer,
        "hidden": hidden,
        "post_url": bulk_url(info.name),
        "runs_url": _runs_url(info, typed),
    }


def _filter_query(typed: dict[str, str]) -> dict[str, str]:
    return {name: typed[f"filter.{name}"] for name in FILTERS if typed.get(f"filter.{name}")}


def _runs_url(info: WorkflowInfo, typed: dict[str, str]) -> str:
    query = _filter_query(typed)
    return f"/console/runs/{quote(info.name, safe='')}" + ("?" + urlencode(query) if query else "")
