"""The one FastAPI app: the API's routers, the console, the guard and the error mapping.

This module is what deploys; `duly dev` adds its own routes around it
(`functions.local.dev`). It sits above `functions.http` and
`functions.console` and includes both, so neither imports the other's top. The
routers are `functions.http.routes`, one per resource; every refusal is
answered by `functions.http.errors`; every request passes the guard
(`functions.http.guard`) first, which names its principal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    Application,
    application_for,
    connect_workflows,
    registered_workflows,
    run_workflows,
)
from functions.console.auth import ConsoleAuth
from functions.console.routes import console_router
from functions.console.templating import (
    STATIC_DIRECTORY as CONSOLE_STATIC,
    STATIC_URL as CONSOLE_STATIC_URL,
)
from functions.http.errors import ServerErrors, install_handlers
from functions.http.guard import Guard, GuardSettings
from functions.http.headers import SecurityHeaders
from functions.http.hosts import AllowedHosts, allowed_hosts_of
from functions.http.routes import (
    audit,
    bulk,
    events,
    graphs,
    health,
    outbox,
    runs,
    schedules,
    writes,
)
from functions.http.routes.docs import (
    DOCS_ASSETS_PACKAGE,
    DOCS_ASSETS_URL,
    docs_router,
    workflow_openapi,
)
from functions.http.state import Current


def create_app(
    Session: async_sessionmaker[AsyncSession] | Application,
    *,
    run_worker: bool,
    worker_options: dict[str, Any] | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> FastAPI:
    """The HTTP API over an application (or a session factory's), with a worker in its
    lifespan if run_worker; every request runs with the application current.

    `allowed_hosts` are the `Host` names served (default DULY_ALLOWED_HOSTS; unset, any).
    """
    given = Session if isinstance(Session, Application) else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # From a session factory, the application takes the parts configured by now.
        application = given if given is not None else application_for(Session)
        app.state.application = application
        if run_worker:
            async with run_workflows(application, **(worker_options or {})) as worker:
                app.state.connection = worker.connection
                yield
        else:
            async with connect_workflows(application) as connection:
                app.state.connection = connection
                yield

    # docs_url and redoc_url None: FastAPI's own pages load their scripts from a CDN;
    # openapi_url None: docs_router serves the schema behind a role.
    app = FastAPI(title="duly", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.Session = given.Session if given is not None else Session
    app.state.application = given
    install_handlers(app)
    settings = GuardSettings.from_env(
        public_prefixes=(f"{CONSOLE_STATIC_URL}/", f"{DOCS_ASSETS_URL}/")
    )
    # The console's logins: the same token, keys and issuer (one verifier) as the API's.
    app.state.console_auth = ConsoleAuth.of(settings.credentials)
    # ServerErrors outside the Guard: a bug in the guard is a logged 500 too.
    app.add_middleware(Guard, settings=settings, console=app.state.console_auth)
    app.add_middleware(ServerErrors)
    hosts = allowed_hosts_of() if allowed_hosts is None else allowed_hosts
    if hosts is not None:  # before the guard: a foreign Host learns nothing of credentials
        app.add_middleware(AllowedHosts, hosts=hosts)
    app.add_middleware(SecurityHeaders)  # outermost: refusals and 500s carry them too
    app.add_middleware(Current)  # every request finds its application
    for resource in (health, runs, outbox, events, writes, schedules, bulk, audit, graphs):
        app.include_router(resource.router)
    app.include_router(docs_router)
    app.include_router(console_router)
    app.mount(DOCS_ASSETS_URL, StaticFiles(packages=[DOCS_ASSETS_PACKAGE]), name="docs-assets")
    app.mount(CONSOLE_STATIC_URL, StaticFiles(directory=CONSOLE_STATIC), name="console-static")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            connection = getattr(app.state, "connection", None)
            infos = connection.workflows if connection is not None else registered_workflows()
            app.openapi_schema = workflow_openapi(app, infos)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def route_roles() -> str:
    """The HTTP reference's table of the least role of every route of the deployed app."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from functions.identity.access import role_table

    engine = create_async_engine("postgresql+psycopg://")  # never connects: routes only
    app = create_app(async_sessionmaker(engine), run_worker=False)
    return role_table(app.routes)


if __name__ == "__main__":
    print(route_roles())
