"""Who acted, for the audit trail: a request's principal and the door it came through."""

from __future__ import annotations

from fastapi import Request

from engine import AuditActor
from functions.identity.access import principal_of

CONSOLE = "console"  # the console's pages
HTTP = "http"  # the API, served by any server
LAMBDA = "lambda"  # the API, reached through a Lambda event


def actor_of(request: Request, door: str | None = None) -> AuditActor:
    """The request's principal acting through `door` (default: the API, `lambda` when a
    Lambda event carried the request)."""
    if door is None:
        door = LAMBDA if request.scope.get("aws.event") is not None else HTTP
    return AuditActor(principal_of(request).id, door)


def console_actor(request: Request) -> AuditActor:
    """The console's user, acting through the console."""
    return actor_of(request, CONSOLE)
