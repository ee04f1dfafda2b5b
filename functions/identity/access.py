"""Who may call a route: each route's declared role, and the request's principal.

The app's guard names the principal of every request (`PRINCIPAL_SCOPE` in
the ASGI scope) before a route runs; a route's `allow(role)` dependency
then answers 403 when that principal lacks the role, or is held to other
routes. `allow(None)` marks a route anyone may call (`/healthz`, the login).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import Depends, Request
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import BaseRoute

from engine import NotAllowedError
from functions.identity.principal import LOCAL, Principal, Role

PRINCIPAL_SCOPE = "duly.principal"  # where the guard leaves a request's principal
ROLE_ATTRIBUTE = "duly_role"  # on an allow() dependency: the role it asks for
PUBLIC = "public"  # how the route table shows a route anyone may call


def principal_in(scope: Mapping[str, Any]) -> Principal | None:
    """The principal the guard named for this request's scope, if any."""
    found = scope.get(PRINCIPAL_SCOPE)
    return found if isinstance(found, Principal) else None


def principal_of(request: Request) -> Principal:
    """The request's principal (LOCAL when no guard ran, as in an app built without one)."""
    return principal_in(request.scope) or LOCAL


def refusal(principal: Principal, role: Role, method: str, path: str) -> str | None:
    """Why `principal` may not send `method path` to a route needing `role`; None if it may."""
    if not principal.route_allowed(method, path):
        return f"{principal.shown}'s credential is held to other routes than {method} {path}."
    if not principal.has(role):
        held = ", ".join(sorted(principal.roles)) or "no role"
        return f"This route needs the {role.value} role; {principal.shown} has {held}."
    return None


def allow(role: Role | None) -> Any:
    """The dependency a route declares: the least role that may call it (None: anyone)."""

    async def check(request: Request) -> None:
        if role is None:
            return
        refused = refusal(principal_of(request), role, request.method, request.url.path)
        if refused is not None:
            raise NotAllowedError(refused)

    setattr(check, ROLE_ATTRIBUTE, PUBLIC if role is None else role.value)
    return Depends(check)


def declared_role(route: APIRoute) -> str | None:
    """The role `route` declares through allow() ("public" for anyone), or None if none."""
    for dependant in route.dependant.dependencies:
        call: Callable[..., Any] | None = dependant.call
        role = getattr(call, ROLE_ATTRIBUTE, None)
        if isinstance(role, str):
            return role
    return None


def declared_routes(routes: Sequence[BaseRoute]) -> list[tuple[str, str, str | None]]:
    """Every (method, path, least role) of an app's API routes, included routers' too."""
    found = []
    for context in iter_route_contexts(routes):
        route = context.route
        if isinstance(context.original_route, APIRoute) and isinstance(route, APIRoute):
            role = declared_role(route)
            path = str(context.path)
            found += [(method, path, role) for method in sorted(route.methods or ())]
    return found


ROLE_ORDER = (PUBLIC, *(role.value for role in Role))
CONSOLE = "/console"


def role_table(routes: Sequence[BaseRoute]) -> str:
    """The HTTP reference's table: each role, and the API's and the console's routes it is the least
    role of (a role may also call what the roles it implies may)."""
    api: dict[str, list[str]] = {role: [] for role in ROLE_ORDER}
    console: dict[str, list[str]] = {role: [] for role in ROLE_ORDER}
    for method, path, role in sorted(declared_routes(routes), key=lambda r: (r[1], r[0])):
        if role is not None and method != "HEAD":
            side = console if path == CONSOLE or path.startswith(CONSOLE + "/") else api
            side[role].append(f"`{method} {path.removeprefix(CONSOLE) or '/'}`")
    lines = ["| Least role | The API | The console (under `/console`) |", "| --- | --- | --- |"]
    lines += [
        f"| {role} | {', '.join(api[role])} | {', '.join(console[role])} |"
        for role in ROLE_ORDER
        if api[role] or console[role]
    ]
    return "\n".join(lines)
