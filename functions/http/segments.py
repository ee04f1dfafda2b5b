"""Routes matched on the path as sent, so an encoded `/` (`%2F`) stays inside its segment.

ASGI servers hand the app the decoded path: a run key `x/cancel` sent as
`/runs/w/x%2Fcancel` would match `/runs/{workflow}/{key}/cancel`. A
`RawPathRoute` matches the raw path instead and decodes each parameter
after, so the key arrives whole; where a server gives no raw path (mangum),
it matches the decoded one, as Starlette does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from fastapi.routing import APIRoute

if TYPE_CHECKING:
    from starlette.routing import Match
    from starlette.types import Scope


def raw_route_path(scope: Scope) -> str | None:
    """The route's part of the path as the client encoded it; None if the scope has none."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        return None
    sent = raw.decode("latin-1").partition("?")[0]
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    if unquote(sent) == path:
        return sent
    if root and sent.startswith(quote(root)) and unquote(sent[len(quote(root)) :]) == path:
        return sent[len(quote(root)) :]  # a server that kept the root in the raw path
    return None  # another layer rewrote the path: the raw one no longer says where it goes


def sent_path(scope: Scope) -> str:
    """The request's whole path as the client encoded it: a link back to the same page."""
    raw = raw_route_path(scope)
    if raw is None:
        return quote(scope["path"])
    return quote(scope.get("root_path", "")) + raw


class RawPathRoute(APIRoute):
    """An API route whose path parameters are the raw path's segments, each decoded."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw = raw_route_path(scope) if scope["type"] == "http" else None
        if raw is None:
            return super().matches(scope)
        match, child = super().matches({**scope, "path": raw, "root_path": ""})
        if "path_params" in child:
            params = dict(child["path_params"])
            for name in self.param_convertors:
                if isinstance(params.get(name), str):
                    params[name] = unquote(params[name])
            child["path_params"] = params
        return match, child
