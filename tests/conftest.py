"""The test session's PostgreSQL and moto, a fresh database for every test.

One embedded server (or DULY_TEST_DATABASE_URL) serves the session; each test gets a
database of its own, created empty and dropped WITH (FORCE), so a test may commit, claim
from several connections and processes, and kill sessions. The machinery is duly's pytest
plugin (`infra/testing/pytest_plugin.py`): `server` and `db` are its `duly_server` and
`duly_database`. moto's server is one a session, emptied for each `moto_endpoint`; the
other fixtures put back what several modules' tests change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING
from urllib.request import Request, urlopen

import pytest

from infra.testing import pytest_plugin
from infra.testing.pytest_plugin import Database, Server, fresh_database
from tests.oidc_issuer import LocalIssuer

if TYPE_CHECKING:
    import httpx
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

__all__ = ["Database", "Server", "fresh_database"]


def pytest_configure(config: pytest.Config) -> None:
    # The plugin comes through duly's pytest11 entry point; a venv installed before the
    # entry point existed, or PYTEST_DISABLE_PLUGIN_AUTOLOAD, would leave it out.
    if not config.pluginmanager.is_registered(pytest_plugin):
        config.pluginmanager.register(pytest_plugin, "duly")


@pytest.fixture(scope="session")
def server(duly_server: Server) -> Server:
    return duly_server


@pytest.fixture
def db(duly_database: Database) -> Database:
    return duly_database


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's server on a free loopback port, for the session; its endpoint URL."""
    from moto.server import ThreadedMotoServer  # only for the tests that ask

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        moto.stop()


@pytest.fixture
def moto_endpoint(moto_server: str) -> str:
    """moto's endpoint URL, every resource of earlier tests forgotten."""
    # moto keeps its state per process, not per server: reset it, start from none.
    urlopen(Request(f"{moto_server}/moto-api/reset", method="POST")).close()
    return moto_server


@pytest.fixture
def dev_app_configured() -> Iterator[None]:
    """What `duly dev` configures for the examples: their registry and graph runtime."""
    from tests.helpers import examples_configured  # the examples load when a test asks

    with examples_configured():
        yield


@pytest.fixture
def fresh_behaviour() -> None:
    """tests.apps.behaviour's controls as new: `release` unset, nobody holding, no errors."""
    import asyncio

    from tests.apps import behaviour

    behaviour.release = asyncio.Event()
    behaviour.holding.clear()
    behaviour.raise_in_step.clear()


@pytest.fixture
def fresh_lambda_runtime() -> Iterator[None]:
    """No container runtime or event registry left behind for the next test."""
    yield
    from engine import configure_event_registry
    from functions.lambdas.runtime import install

    install(None)
    configure_event_registry(None)


@pytest.fixture
def oidc_issuer() -> Iterator[LocalIssuer]:
    """A local OpenID Connect issuer on loopback (tests/oidc_issuer.py), stopped after."""
    issuer = LocalIssuer().start()
    try:
        yield issuer
    finally:
        issuer.stop()


@pytest.fixture
def open_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API token, API keys or webhook secret set: the app's writes are open, as under
    `duly dev`, for tests about what the routes do rather than who may call them."""
    for name in ("DULY_API_TOKEN", "DULY_API_KEYS", "DULY_WEBHOOK_SECRET"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def client(Session: async_sessionmaker[AsyncSession]) -> AsyncIterator[httpx.AsyncClient]:
    """The app, with no worker, over the module's own `Session` fixture, served on loopback."""
    from functions.app import create_app
    from tests.helpers import serving

    async with serving(create_app(Session, run_worker=False)) as served:
        yield served


@pytest.fixture
def failing_registry() -> Iterator[None]:
    """The process's event registry whose `order.charged` handler always fails, then none."""
    from engine import configure_event_registry
    from tests.bulk_helpers import configure_failing_registry

    configure_failing_registry()
    try:
        yield
    finally:
        configure_event_registry(None)
