"""The one mapping from duly's errors to HTTP statuses and bodies, and the last-resort 500.

A client's mistake is a 4xx: a value refused where it sits (422, each
problem placed), something named that does not exist (404), a state that
refuses the request (409), a known caller without the role or right
to do it (403), any other DulyError or a value PostgreSQL
refused (400). A ConfigurationError met while serving is the deployment's
fault, not the client's: a 500, logged, its message kept out of the reply.
The console's pages take their statuses from here too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount

from engine import (
    AlreadyVotedError,
    ConfigurationError,
    DulyError,
    NotAllowedError,
    NotFoundError,
    RunBusyError,
    StateWorkflowError,
    TemplateInvalidError,
    TemplateNotActiveError,
    WorkflowAlreadyCompletedError,
    WorkflowSubmissionError,
    WorkflowTransitionError,
)
from functions.requests.errors import (
    MAX_PROBLEMS,
    ConflictError,
    InputError,
    Problem,
    problems_of,
    refusal_of,
    shortened,
)
from functions.requests.nesting import TOO_DEEP

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")  # what a 405's Allow may name
log = logging.getLogger("duly.http")

SERVER_ERROR = "Internal server error: the traceback is in the server's log."
# The first class an error is an instance of gives its status: the narrower first.
STATUSES: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigurationError, 500),
    (InputError, 422),
    (NotAllowedError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (RunBusyError, 409),
    (WorkflowAlreadyCompletedError, 409),
    (WorkflowSubmissionError, 409),
    (TemplateNotActiveError, 409),
    (AlreadyVotedError, 409),
    (TemplateInvalidError, 400),
    (StateWorkflowError, 400),
    (WorkflowTransitionError, 400),
    (DulyError, 400),
    (DataError, 400),
)


def status_of(exc: BaseException) -> int:
    """The HTTP status that answers `exc` (500 for anything not known as a client's mistake)."""
    if problems_of(exc) is not None:
        return 422
    for kind, status in STATUSES:
        if isinstance(exc, kind):
            return status
    return 500


def message_of(exc: BaseException) -> str:
    """The sentence a refusal answers with; a 500 says only that the log has it."""
    if status_of(exc) >= 500:
        return SERVER_ERROR
    return refusal_of(exc)


def problem_body(problem: Problem) -> dict[str, Any]:
    """One placed problem as a 422 lists it, as FastAPI's own list: under `body`, unless it
    sits in the URL (`path`, `query`)."""
    loc = (
        list(problem.loc) if problem.loc[:1] in (("path",), ("query",)) else ["body", *problem.loc]
    )
    return {"loc": loc, "msg": problem.msg, "type": problem.type}


def body_of(exc: BaseException) -> dict[str, Any]:
    """The JSON body that answers `exc`."""
    problems = problems_of(exc)
    if problems is not None:
        return {"detail": [problem_body(problem) for problem in problems]}
    body: dict[str, Any] = {"detail": message_of(exc)}
    if isinstance(exc, WorkflowTransitionError):  # a graph's refusal: its stable code too
        body["code"] = exc.code
        if isinstance(exc, TemplateInvalidError):
            body["errors"] = list(exc.errors)
    return body


async def refused(request: Request, exc: Exception) -> JSONResponse:
    """The reply to a DulyError or a DataError raised by a route."""
    status = status_of(exc)
    if status >= 500:
        log.error("%s %s failed.", request.method, request.url.path, exc_info=exc)
    return JSONResponse(body_of(exc), status_code=status)


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 with where and why each value was refused, never the value itself.

    FastAPI's own handler echoes the input back (5 MB in, 5 MB out) and fails
    with a 500 on what JSON cannot encode, such as the Infinity it refused.
    """
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [p if isinstance(p, int) else shortened(str(p)) for p in error["loc"]],
            "msg": shortened(str(error["msg"])),
            "type": str(error["type"]),
        }
        for error in exc.errors()[:MAX_PROBLEMS]
    ]
    return JSONResponse({"detail": errors}, status_code=422)


async def unparsed_body(request: Request, exc: Exception) -> Response:
    """An HTTPException as FastAPI answers it, but for a JSON body nested past what Python's
    parser holds (FastAPI's 400 raised from a RecursionError): the request layer's 422."""
    assert isinstance(exc, HTTPException)
    if isinstance(exc.__cause__, RecursionError):
        problem = Problem((), TOO_DEEP, "json_too_deep")
        return JSONResponse({"detail": [problem_body(problem)]}, status_code=422)
    allowed = allowed_methods(request) if exc.status_code == 405 else ""
    if allowed:  # Starlette's Allow names the first route's methods only
        exc = HTTPException(405, exc.detail, {**(exc.headers or {}), "Allow": allowed})
    return await http_exception_handler(request, exc)


def allowed_methods(request: Request) -> str:
    """A 405's `Allow`: every method some route of the app takes at this request's path
    ("" under a mount, static files, whose own Allow stands)."""
    routes = [route for route in request.app.router.routes if not isinstance(route, Mount)]
    return ", ".join(
        method
        for method in METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    )


def install_handlers(app: FastAPI) -> None:
    """Answer every error a route raises by this module's mapping."""
    app.add_exception_handler(DulyError, refused)
    app.add_exception_handler(DataError, refused)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, unparsed_body)


class ServerErrors:
    """Turns an exception no handler took (a bug) into a logged 500 with a short JSON body.

    Starlette's own last-resort handler answers in plain text and raises the
    exception again, so servers log the traceback a second time.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception:
            log.exception("%s %s failed.", scope["method"], scope["path"])
            if started:
                raise  # too late for a 500: the server closes the connection
            response = JSONResponse({"detail": SERVER_ERROR}, status_code=500)
            await response(scope, receive, send)
