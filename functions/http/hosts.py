"""The `Host` names the app answers to (`DULY_ALLOWED_HOSTS`), against DNS rebinding.

A page of another site whose name is made to resolve to this server sends
its own name as `Host`: a request naming any host but those allowed is
refused (421) before it reaches the guard or a route. `duly dev` allows
its own names when the variable is unset (`dev_hosts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse

from engine import settings as variables

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
MAX_SHOWN_HOST = 100  # characters of a refused Host said back
MISDIRECTED = 421  # the request names a host this server does not serve
# Load balancers probe health by address, not by name: nothing there to steal.
UNCHECKED_PATHS = frozenset({"/healthz"})


def allowed_hosts_of(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """The host names of DULY_ALLOWED_HOSTS, lowercased; None when unset (any host)."""
    raw = variables.ALLOWED_HOSTS.read(environ)
    if raw is None:
        return None
    names = frozenset(name.strip().lower() for name in raw.split(",") if name.strip())
    return names or None


def dev_hosts(bind_host: str, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """What `duly dev` answers to: DULY_ALLOWED_HOSTS, else loopback and the host it binds."""
    configured = allowed_hosts_of(environ)
    if configured is not None:
        return configured
    bound = f"[{bind_host}]" if ":" in bind_host and not bind_host.startswith("[") else bind_host
    return frozenset({*LOOPBACK_HOSTS, bound.lower()})


def host_name(host_header: str) -> str:
    """The name of a `Host` header without its port: `[::1]:8000` -> `[::1]`."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Whether `name` is allowed: named exactly, or under a `*.example.com` pattern."""
    for pattern in allowed:
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


class AllowedHosts:
    """Refuses (421, JSON) a request whose `Host` is not one of `hosts`."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCHECKED_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"host"), b"")
        name = host_name(header.decode("latin-1"))
        if host_allowed(name, self.hosts):
            await self.app(scope, receive, send)
            return
        detail = (
            f"This server does not answer to the host {name[:MAX_SHOWN_HOST] or '(none)'!r}: "
            "add it to DULY_ALLOWED_HOSTS to serve it."
        )
        await JSONResponse({"detail": detail}, status_code=MISDIRECTED)(scope, receive, send)
