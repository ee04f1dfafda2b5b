"""A workflow's runs (`/console/runs/{workflow}`) and one run's page, with its actions.

The list and the run are `engine.views.runs`'s (the queries of the JSON
API and of `duly runs` / `duly show`). A run's page redraws its state, row
and attempts every 2 s while the run can still change (5 s once it rests),
its actions' forms untouched; its newest failed attempts open onto their
arguments and traceback. Every action is a form read
into the request layer's own model (`functions.requests.runs`) and done
by its functions, as the JSON API's routes do, so a form is checked and
refused exactly as the API would; run, deliver and cancel ask for a
confirmation first, then go back to the run's page (Post/Redirect/Get)
saying what they did. A refusal redraws the form with each error beside
its field.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy.exc import DataError

from engine import (
    DEFAULT_PAGE,
    ENGINE_COLUMNS,
    MAX_FILTER_TEXT,
    MOVED_MEANWHILE,
    REFUSAL_REASONS,
    RUN_ORDERS,
    RUN_STATES,
    SCAN_WINDOW,
    ConfigurationError,
    DulyError,
    InvalidArgumentError,
    RunDetail,
    RunFilter,
    RunKey,
    RunPage,
    Step,
    WorkflowInfo,
    database_now,
    filterable_columns,
    list_runs,
    parse_filter,
    run_detail,
    time_columns,
)
from functions.console.charts import timeline
from functions.console.forms import (
    errors_by_field,
    fields_of,
    raw_values,
    shown_values,
    values_of,
)
from functions.console.rendering import ConsolePage, connection_of, problem_of, render
from functions.http.errors import message_of
from functions.identity.access import allow
from functions.identity.actors import console_actor
from functions.identity.principal import Role
from functions.requests import runs
from functions.requests.errors import InputError, from_validation, problems_of
from functions.requests.lookup import find_entry_step, find_step, find_workflow, find_writable
from functions.requests.runs import (
    CancelRequest,
    DeliverRequest,
    RunRequest,
    StartRequest,
    build_call,
    columns_of,
    url_key,
)

router = APIRouter(prefix="/runs", route_class=ConsolePage)

ATTEMPTS_SHOWN = 200  # a run page's newest attempts
FAILURES_DETAILED = 20  # of those, the newest failed ones shown with arguments and traceback
LIVE_STATES = frozenset({"running", "waiting", "scheduled", "retrying"})
ACTIONS = ("run", "deliver")
FilterText = Annotated[str | None, Query(max_length=MAX_FILTER_TEXT)]
# What a run's page says after an action sent it back there (`?done=...&count=n`).
DONE = {
    "started": "Started: the run is due now.",
    "run": "Done: {count} run(s) will run the step now.",
    "deliver": "Delivered: the run took the event now.",
    "held": "Held: the run is not waiting for this event yet; it holds it until it waits for "
    "it, and drops it if it ends, fails or waits for another step first.",
    "cancel": "Cancelled: {count} run(s) were still live.",
}


def run_url(workflow: str, key: str) -> str:
    """The console's page of one run."""
    return f"/console/runs/{quote(workflow, safe='')}/{quote(key, safe='')}"


def _writable(request: Request, workflow: str) -> WorkflowInfo:
    """The workflow, if the API lets runs of it be started and addressed (not the outbox)."""
    return find_writable(connection_of(request), workflow)


# -- the list ------------------------------------------------------------------------------------


@router.get("/{workflow}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def runs_page(
    request: Request,
    workflow: str,
    state: FilterText = None,
    step: FilterText = None,
    key: FilterText = None,
    error: FilterText = None,
    order: FilterText = "newest",
    q: FilterText = None,
    after: Annotated[str | None, Query(max_length=2000)] = None,
) -> HTMLResponse:
    """A page of a workflow's runs, filtered (the search box and the fields, ANDed), newest
    or soonest first; a search it cannot read is said beside the box."""
    connection = connection_of(request)
    info = find_workflow(connection, workflow)
    given = {"state": state, "step": step, "key": key, "error": error}
    fields = RunFilter(state=state or None, step=step or None, key=key or None, error=error or None)
    filters = fields
    chosen = order or "newest"
    search = (q or "").strip()
    refusal = None
    try:
        if search:
            filters = parse_filter(info, search).also(filters)
        page = await list_runs(
            connection, info, filters, order=chosen, limit=DEFAULT_PAGE, after=after or None
        )
    except InvalidArgumentError as exc:  # the search, as typed
        refusal = str(exc)
        page = RunPage(info.name, chosen, [], None, None)
    query = {name: value for name, value in given.items() if value}
    if search:
        query["q"] = search
    query["order"] = chosen
    next_url = None
    if page.next_after is not None:
        next_url = f"?{urlencode({**query, 'after': page.next_after})}"
    business = [c.name for c in info.table.c if c.name not in ENGINE_COLUMNS][:4]
    async with connection.autocommit.connect() as conn:
        now = await database_now(conn)
    context = {
        "title": f"{info.name} runs",
        "now": now,
        "info": info,
        "page": page,
        "filters": fields,  # what the fields show: the search box's terms stay in the box
        "search": search,
        "refusal": refusal,
        "filterable": filterable_columns(info),
        "times": time_columns(info),
        "order": chosen,
        "orders": RUN_ORDERS,
        "states": RUN_STATES,
        "steps": list(info.steps),
        "business": business,
        "next_url": next_url,
        "window": SCAN_WINDOW,
        "first_url": f"?{urlencode(query)}" if after else None,
        "startable": not info.engine_owned,
        "run_url": run_url,
    }
    return render(request, "runs/list.html", context, status_code=400 if refusal else 200)


# -- starting a run ------------------------------------------------------------------------------


@router.get("/{workflow}/start", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)])
async def start_form(
    request: Request, workflow: str, step: Annotated[str | None, Query(max_length=200)] = None
) -> HTMLResponse:
    """The form that starts a run: its row's columns, its first step and that step's arguments."""
    info = _writable(request, workflow)
    chosen = _step_of(info, step, starting=True)
    return _start_page(request, info, chosen, {}, {}, [])


@router.post("/{workflow}/start", response_model=None, dependencies=[allow(Role.OPERATOR)])
async def start_run(request: Request, workflow: str) -> Response:
    """Start the run the form describes, through the API's `POST /workflows/{name}/start`."""
    info = _writable(request, workflow)
    form = await request.form()
    chosen = _step_of(info, _text(form.get("step")), starting=True)
    typed = raw_values(form, ("row", "args"))
    row_fields = fields_of(columns_of(info).model, "row")
    arg_fields = fields_of(chosen.arguments.model, "args")
    row, row_errors = values_of(row_fields, form)
    args, arg_errors = values_of(arg_fields, form)
    if row_errors or arg_errors:
        return _start_page(request, info, chosen, typed, {**row_errors, **arg_errors}, [], 400)
    try:
        body = StartRequest(row=row, step=chosen.name, args=args)
        started = await runs.start_run(info, body, actor=console_actor(request))
    except REFUSALS as exc:
        return _start_page(request, info, chosen, typed, *_refusal(exc))
    target = run_url(info.name, started["key"]) + "?done=started"
    return RedirectResponse(target, status_code=303)


def _start_page(
    request: Request,
    info: WorkflowInfo,
    chosen: Step[Any, Any],
    typed: dict[str, str],
    errors: dict[str, str],
    general: list[str],
    status_code: int = 200,
) -> HTMLResponse:
    context = {
        "title": f"Start a run of {info.name}",
        "info": info,
        "step": chosen,
        "steps": list(info.entry_steps or info.steps),  # only those a run may start at
        "row_fields": fields_of(columns_of(info).model, "row"),
        "arg_fields": fields_of(chosen.arguments.model, "args"),
        "typed": typed,
        "errors": errors,
        "general": general,
    }
    return render(request, "runs/start.html", context, status_code=status_code)


# -- one run -------------------------------------------------------------------------------------


@router.get(
    "/{workflow}/{key}/live", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)]
)
async def run_live(request: Request, workflow: str, key: str) -> HTMLResponse:
    """The part of a run's page that redraws itself while the run can change."""
    return render(request, "runs/live.html", await _run_context(request, workflow, key))


@router.get(
    "/{workflow}/{key}/{action}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)]
)
async def action_form(
    request: Request,
    workflow: str,
    key: str,
    action: str,
    step: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    """The form of an action on a run: run a step now, or deliver an event to it."""
    if action not in ACTIONS:
        raise HTTPException(404, f"No action {action!r} on a run: use one of run, deliver.")
    info = _writable(request, workflow)
    detail = await run_detail(connection_of(request), info, _run_key(info, key), attempts=0)
    chosen = _step_of(info, step or detail.summary.waiting_for)
    return _action_page(request, info, detail, action, chosen, {}, {}, [])


@router.post("/{workflow}/{key}/{action}", response_model=None, dependencies=[allow(Role.OPERATOR)])
async def act_on_run(request: Request, workflow: str, key: str, action: str) -> Response:
    """Run a step now, deliver an event, or cancel: first a confirmation, then the API's route."""
    if action not in (*ACTIONS, "cancel"):
        raise HTTPException(404, f"No action {action!r} on a run: use run, deliver or cancel.")
    info = _writable(request, workflow)
    addressed = _run_key(info, key)  # parsed once, refused as the API refuses a body's key
    connection = connection_of(request)
    detail = await run_detail(connection, info, addressed, attempts=0)
    form = await request.form()
    confirmed = form.get("confirmed") == "yes"
    if action == "cancel":
        if not confirmed:
            return _confirm_page(request, info, detail, "cancel", None, {}, {})
        cancelled = await runs.cancel_runs(
            info, CancelRequest(), actor=console_actor(request), key=addressed
        )
        return _back_to_run(info.name, key, "cancel", cancelled)
    chosen = _step_of(info, _text(form.get("step")))
    typed = raw_values(form, ("args", "options"))
    args, errors = values_of(fields_of(chosen.arguments.model, "args"), form)
    if errors:
        return _action_page(request, info, detail, action, chosen, typed, errors, [], 400)
    options = _delivery_options(form) if action == "deliver" else {}
    try:
        if not confirmed:
            build_call(chosen, args)  # the request layer's own check, before asking to confirm
            return _confirm_page(request, info, detail, action, chosen, typed, options)
        if action == "deliver":
            body = DeliverRequest(step=chosen.name, args=args, **options)
            delivered = await runs.deliver_event(info, body, addressed)
            if not delivered:  # one run: one reason, said on its page
                [reason] = delivered.refused or [MOVED_MEANWHILE]
                return _back_to_run(info.name, key, action, 0, refused=reason)
            # Taken now, or held until the run waits: the page says which.
            return _back_to_run(info.name, key, "held" if delivered.held else action, 1)
        else:
            ran = RunRequest(step=chosen.name, args=args)
            count = await runs.run_step(info, ran, actor=console_actor(request), key=addressed)
    except REFUSALS as exc:
        return _action_page(request, info, detail, action, chosen, typed, *_refusal(exc))
    return _back_to_run(info.name, key, action, count)


# What a form's write may be refused with: redrawn with the refusal, beside its field.
REFUSALS = (DulyError, DataError, ValidationError)


def _refusal(exc: Exception) -> tuple[dict[str, str], list[str], int]:
    """A refused form's errors by field, those no field names, and the page's status."""
    if isinstance(exc, ConfigurationError):
        raise exc  # the deployment's mistake, not the form's: a logged 500
    problems = problems_of(exc)
    if isinstance(exc, ValidationError):
        problems = from_validation(exc).problems
    if problems is not None:
        errors = [{"loc": problem.loc, "msg": problem.msg} for problem in problems]
        by_field, general = errors_by_field(errors)
        return by_field, general, 400
    status, message = problem_of(exc)
    return {}, [message], status


@router.get(
    "/{workflow}/{key:path}", response_class=HTMLResponse, dependencies=[allow(Role.VIEWER)]
)
async def run_page(
    request: Request,
    workflow: str,
    key: str,
    done: Annotated[str | None, Query(max_length=20)] = None,
    count: Annotated[int, Query(ge=0, le=10**9)] = 0,
    refused: Annotated[str | None, Query(max_length=40)] = None,
) -> HTMLResponse:
    """One run: its row, what it waits for, its attempts as a timeline, and its actions."""
    context = await _run_context(request, workflow, key)
    note = DONE.get(done or "")
    context["note"] = note.format(count=count) if note else None
    if done == "deliver" and refused in REFUSAL_REASONS:  # a fixed sentence, never the query's
        context["note"] = f"Not delivered: {REFUSAL_REASONS[refused]}."
    return render(request, "runs/run.html", context)


async def _run_context(request: Request, workflow: str, key: str) -> dict[str, Any]:
    connection = connection_of(request)
    info = find_workflow(connection, workflow)
    detail = await run_detail(connection, info, _run_key(info, key), attempts=ATTEMPTS_SHOWN)
    summary = detail.summary
    business = {k: v for k, v in summary.row.items() if k not in ENGINE_COLUMNS}
    history = detail.history or []
    label = (
        f"Timeline of {info.name} {summary.key}: {len(history)} attempts shown, "
        f"{sum(a['outcome'] != 'ok' for a in history)} failed."
    )
    deadline = None
    if isinstance(summary.deadline, str):  # stored as ISO text in the wait's arguments
        try:
            deadline = datetime.fromisoformat(summary.deadline)
        except ValueError:
            deadline = None
    parent = summary.parent
    parent_url = None
    if parent:
        parent_key = parent.get("key", [])
        parent_text = str(parent_key[0]) if len(parent_key) == 1 else _json_list(parent_key)
        parent_url = run_url(str(parent.get("table")), parent_text)
    failed = detail.failed_attempts()
    # Running a step again on a failed run most often means the step that failed.
    rerun_step = summary.row.get("next_step")
    if summary.state == "failed" and failed:
        rerun_step = failed[-1]["step"]
    return {
        "title": f"{info.name} {summary.key}",
        "info": info,
        "detail": detail,
        "detailed": {a["id"] for a in failed[-FAILURES_DETAILED:]},
        "rerun_step": rerun_step,
        "run": summary,
        "business": business,
        "engine": detail.engine,
        "history": history,
        "timeline": timeline(history, label=label),
        "live": summary.state in LIVE_STATES,
        "now": detail.now,
        "steps": list(info.steps),
        "actionable": not info.engine_owned,
        "parent_url": parent_url,
        "deadline": deadline,
        "run_url": run_url,
        "live_url": run_url(info.name, summary.key) + "/live",
    }


def _action_page(
    request: Request,
    info: WorkflowInfo,
    detail: RunDetail,
    action: str,
    chosen: Step[Any, Any],
    typed: dict[str, str],
    errors: dict[str, str],
    general: list[str],
    status_code: int = 200,
) -> HTMLResponse:
    verb = "Run a step now" if action == "run" else "Deliver an event"
    context = {
        "title": f"{verb}: {info.name} {detail.summary.key}",
        "verb": verb,
        "info": info,
        "run": detail.summary,
        "action": action,
        "step": chosen,
        "steps": list(info.steps),
        "fields": fields_of(chosen.arguments.model, "args"),
        "typed": typed,
        "errors": errors,
        "general": general,
        "run_url": run_url(info.name, detail.summary.key),
    }
    return render(request, "runs/action.html", context, status_code=status_code)


def _confirm_page(
    request: Request,
    info: WorkflowInfo,
    detail: RunDetail,
    action: str,
    chosen: Step[Any, Any] | None,
    typed: dict[str, str],
    options: dict[str, Any],
) -> HTMLResponse:
    summary = detail.summary
    questions = {
        "cancel": f"Cancel {info.name} {summary.key}? It stops where it stands "
        f"({summary.state}); what it has done stays.",
        "run": f"Run {chosen.name if chosen else ''} now on {info.name} {summary.key}? "
        "It replaces what the run had scheduled.",
        "deliver": f"Deliver the event for {chosen.name if chosen else ''} to {info.name} "
        f"{summary.key}?",
    }
    context = {
        "title": "Confirm",
        "question": questions[action],
        "action": action,
        "step": chosen,
        "typed": typed,
        "shown": shown_values(typed),
        "options": options,
        "post_url": run_url(info.name, summary.key) + f"/{action}",
        "back_url": run_url(info.name, summary.key),
    }
    return render(request, "runs/confirm.html", context)


def _back_to_run(
    workflow: str, key: str, action: str, count: int, refused: str | None = None
) -> RedirectResponse:
    query: dict[str, Any] = {"done": action, "count": count}
    if refused is not None:
        query["refused"] = refused
    target = run_url(workflow, key) + "?" + urlencode(query)
    return RedirectResponse(target, status_code=303)


def _step_of(info: WorkflowInfo, name: str | None, *, starting: bool = False) -> Step[Any, Any]:
    """The step named, as the API finds it (to start a run: an entry step), or the first."""
    if not info.steps:
        raise HTTPException(404, f"Workflow {info.name} has no steps.")
    if not name:
        return info.steps[((info.entry_steps if starting else ()) or tuple(info.steps))[0]]
    return find_entry_step(info, name) if starting else find_step(info, name)  # 400 page


def _run_key(info: WorkflowInfo, key: str) -> RunKey:
    """The page's run key, read once; one that is not a key of `info` is a 422 page with the
    request layer's sentence (a form's values are 400 pages, the URL's key is not one)."""
    try:
        return url_key(info, key)
    except InputError as exc:
        raise HTTPException(422, message_of(exc)) from None


def _delivery_options(form: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"restart": form.get("options.restart") == "true"}
    idempotency = _text(form.get("options.idempotency_key"))
    if idempotency:
        options["idempotency_key"] = idempotency
    return options


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json_list(values: list[Any]) -> str:
    return json.dumps(values)
