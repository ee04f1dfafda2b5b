"""duly's pytest plugin: a database of each test's own, a Session on it, drain and the clock.

Installed with duly (the `pytest11` entry point), it loads in every pytest run
of the environment, so importing it starts nothing and imports neither
SQLAlchemy, psycopg nor the engine. Its fixtures, all named `duly_*`
(`duly_server`, `duly_database`, `duly_metadata`, `duly_session`, `duly_app`,
`duly_connection`, `duly_drain`, `duly_clock`), are described in docs/how-to/testing.md;
the async ones need pytest-asyncio, and `duly_server` needs `duly[local]`
unless DULY_TEST_DATABASE_URL names a server.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

    from engine import Duly, WorkflowConnection
    from infra.embedded import EmbeddedPostgres

try:
    # pytest-asyncio's own decorator, so the fixtures also run in its strict mode.
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # without pytest-asyncio, pytest itself refuses async fixtures when used
    async_fixture = pytest.fixture  # type: ignore[assignment]

TEST_DATABASE_URL = "DULY_TEST_DATABASE_URL"  # a server to create test databases on
APP_VARIABLE = "DULY_APP"  # the module that maps the app's workflows, as for `duly dev`
APP_INI = "duly_app"  # the same, in the pytest configuration; it wins over DULY_APP
DATABASE_PREFIX = "duly_test_"  # test databases are named this and 12 hex digits
POOL_SIZE = 10  # connections of a test database's engine: a worker and its steps


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        APP_INI,
        type="args",
        default=[],
        help="duly: the modules that map the workflows whose tables duly_session creates "
        f"(default: ${APP_VARIABLE}, else every workflow mapped when the test runs).",
    )


@dataclass
class Server:
    """Where the test session's PostgreSQL is: a SQLAlchemy URL for any database on it."""

    base_url: str
    embedded: EmbeddedPostgres | None = None

    @classmethod
    def from_url(cls, url: str) -> Server:
        """A server given by URL; a plain `postgresql://` one gets the psycopg 3 driver."""
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        return cls(parsed.render_as_string(hide_password=False))

    @property
    def admin_database(self) -> str:
        """The database to connect to for CREATE and DROP DATABASE: the URL's own."""
        from sqlalchemy.engine import make_url

        return make_url(self.base_url).database or "postgres"

    def url_for(self, database: str) -> str:
        """The SQLAlchemy URL of `database` on this server."""
        from sqlalchemy.engine import make_url

        return make_url(self.base_url).set(database=database).render_as_string(hide_password=False)

    def conninfo_for(self, database: str) -> str:
        """The libpq URL of `database` on this server, for `psycopg.connect`."""
        from sqlalchemy.engine import make_url

        return (
            make_url(self.url_for(database))
            .set(drivername="postgresql")
            .render_as_string(hide_password=False)
        )


@contextlib.contextmanager
def open_server() -> Iterator[Server]:
    """DULY_TEST_DATABASE_URL's server, else an embedded PostgreSQL stopped on exit."""
    from engine import settings as variables

    given = variables.TEST_DATABASE_URL.read()
    if given:
        yield Server.from_url(given)
        return
    embedded = import_start_embedded()(tuned_for_tests=True)
    try:
        yield Server(embedded.url, embedded)
    finally:
        embedded.stop()


def import_start_embedded() -> Any:
    """`infra.embedded.start_embedded`, or a test failure that says what to install."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns at the wheel's import when XDG_RUNTIME_DIR is unset (root,
            # CI); a project with filterwarnings = error would fail every test on it.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            from infra.embedded import start_embedded
    except ImportError as exc:
        pytest.fail(
            "duly's test fixtures need a PostgreSQL: install the embedded one with "
            f"`pip install 'duly[local]'`, or set {TEST_DATABASE_URL} to a server's URL "
            f"(postgresql://user:password@host/postgres). ({exc})",
            pytrace=False,
        )
    return start_embedded


@dataclass
class Database:
    """A database of a test's own, and the engines opened on it (disposed of at the end)."""

    name: str
    url: str
    conninfo: str
    engines: list[AsyncEngine] = field(default_factory=list)

    def engine(self, **kwargs: object) -> AsyncEngine:
        """A new AsyncEngine on this database, disposed of when the database is dropped."""
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(self.url, **kwargs)
        self.engines.append(engine)
        return engine

    async def create(self, *metadatas: MetaData) -> async_sessionmaker[AsyncSession]:
        """Create the tables of `metadatas` and return a session factory for them."""
        from sqlalchemy.ext.asyncio import async_sessionmaker

        engine = self.engine(pool_size=POOL_SIZE)
        async with engine.begin() as conn:
            for metadata in metadatas:
                await conn.run_sync(metadata.create_all)
        return async_sessionmaker(engine, expire_on_commit=False)

    def sql(self, query: str, *params: object) -> list[tuple[object, ...]]:
        """Run one statement on a plain connection of its own; the rows it returned."""
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            cursor = conn.execute(query, params or None)
            return cursor.fetchall() if cursor.description else []


@contextlib.asynccontextmanager
async def fresh_database(server: Server) -> AsyncIterator[Database]:
    """A database of its own on `server`, dropped (WITH FORCE) afterwards."""
    import psycopg

    name = f"{DATABASE_PREFIX}{uuid.uuid4().hex[:12]}"
    admin = server.conninfo_for(server.admin_database)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    database = Database(name, server.url_for(name), server.conninfo_for(name))
    try:
        yield database
    finally:
        for engine in database.engines:
            await engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            # FORCE ends the sessions a test left open (a killed worker's, a leaked pool's).
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def app_modules(config: pytest.Config) -> list[str]:
    """The modules named by the ini option duly_app, else by DULY_APP (commas or spaces)."""
    named: list[str] = config.getini(APP_INI)
    if named:
        return named
    from engine import settings as variables

    return (variables.APP.text() or "").replace(",", " ").split()


def app_metadata(modules: Iterable[str]) -> list[MetaData]:
    """The distinct MetaData of the workflows and attempt logs the modules map."""
    from infra.schema import distinct_metadata, load_app

    metadatas: list[MetaData] = []
    for module in modules:
        try:
            metadatas.extend(load_app(module))
        except LookupError as exc:
            pytest.fail(f"{exc} (from the ini option {APP_INI} or {APP_VARIABLE})", pytrace=False)
    return distinct_metadata(metadatas)


def unnamed_app_parts(application: Any) -> list[str]:
    """The registries and graph runtimes an app module defines by the names duly looks for,
    in the packages of the tables mapped now (duly's own aside), that `application` lacks."""
    from infra.app_config import APP_GRAPH_RUNTIME, APP_REGISTRY
    from infra.schema import mapped_classes
    from infra.schema.app_layout import DULY_PACKAGES

    # Every class mapped on the workflows' bases: an app of graphs alone maps no workflow.
    registries = {cls.registry for cls in mapped_classes()}
    mapped = {mapper.class_ for registry in registries for mapper in registry.mappers}
    packages = {cls.__module__.partition(".")[0] for cls in mapped} - set(DULY_PACKAGES)
    used = {id(application.event_registry), id(application.graph_runtime)}
    return sorted(
        f"{name}.{attribute}"
        for name, module in list(sys.modules.items())
        if module is not None and name.partition(".")[0] in packages
        for attribute in (APP_REGISTRY, APP_GRAPH_RUNTIME)
        if attribute in vars(module) and id(vars(module)[attribute]) not in used
    )


def mapped_metadata() -> list[MetaData]:
    """The distinct MetaData of every workflow and attempt log mapped in this process."""
    from infra.schema import distinct_metadata, mapped_classes

    return distinct_metadata(cls.__table__.metadata for cls in mapped_classes())


@dataclass(frozen=True)
class Drain:
    """`await duly_drain()`: run every step due now, and what they make due now."""

    sessionmaker: async_sessionmaker[AsyncSession]
    application: Duly | None = None  # whose registry and graph runtime its steps use

    async def __call__(
        self, workflows: Iterable[type[Any]] | None = None, *, max_concurrency: int = 8
    ) -> int:
        """How many steps it started (see `engine.testing.drain`)."""
        from engine.testing import drain

        if self.application is None:
            return await drain(self.sessionmaker, workflows, max_concurrency=max_concurrency)
        with self.application.current():
            return await drain(self.sessionmaker, workflows, max_concurrency=max_concurrency)


@dataclass(frozen=True)
class Clock:
    """The test database's clock, which every worker on it reads: move it instead of sleeping."""

    sessionmaker: async_sessionmaker[AsyncSession]

    async def move(self, by: timedelta) -> timedelta:
        """Move the clock forward by `by` (backward if negative); the new shift."""
        from engine.testing import move_clock

        return await move_clock(self.sessionmaker, by)

    async def reset(self) -> None:
        """Put the clock back on PostgreSQL's own time."""
        from engine.testing import reset_clock

        await reset_clock(self.sessionmaker)

    async def shift(self) -> timedelta:
        """How far the clock is moved from PostgreSQL's own time."""
        from engine.testing import read_clock_shift

        return await read_clock_shift(self.sessionmaker)


@pytest.fixture(scope="session")
def duly_server() -> Iterator[Server]:
    """The session's PostgreSQL: DULY_TEST_DATABASE_URL's, else an embedded one."""
    with open_server() as server:
        yield server


@async_fixture
async def duly_database(duly_server: Server) -> AsyncIterator[Database]:
    """A database of this test's own, so it may commit, claim and kill sessions freely."""
    async with fresh_database(duly_server) as database:
        yield database


@pytest.fixture
def duly_metadata(pytestconfig: pytest.Config) -> list[MetaData]:
    """The tables `duly_session` creates; override this fixture to choose them yourself."""
    modules = app_modules(pytestconfig)
    found = app_metadata(modules) if modules else mapped_metadata()
    if not found:
        pytest.fail(
            "duly_session found no workflow to create tables for: import your workflow "
            f"module in the test, name it in the ini option {APP_INI} (or {APP_VARIABLE}), "
            "or override the duly_metadata fixture.",
            pytrace=False,
        )
    return found


@async_fixture
async def duly_session(
    duly_database: Database, duly_metadata: MetaData | Iterable[MetaData]
) -> async_sessionmaker[AsyncSession]:
    """A session factory on this test's database, with the app's tables created."""
    from sqlalchemy import MetaData

    metadatas = [duly_metadata] if isinstance(duly_metadata, MetaData) else list(duly_metadata)
    return await duly_database.create(*metadatas)


@pytest.fixture
def duly_app(pytestconfig: pytest.Config, duly_session: async_sessionmaker[AsyncSession]) -> Duly:
    """The app's application on this test's database: its event registry (a database one
    for its outbox) and graph runtime, configured as `duly dev` and the Lambda runtime do."""
    from engine import Duly, current_application
    from infra.app_config import app_application

    modules = app_modules(pytestconfig)
    if not modules:
        current = current_application()
        application = current.parts_for(duly_session, Duly) if current else Duly(duly_session)
        if unnamed := unnamed_app_parts(application):
            warnings.warn(
                f"duly_app is not set, so {', '.join(unnamed)} are not this test's: their "
                f"handlers never run and their graphs are not found. Name the app module in "
                f"the ini option {APP_INI} (or {APP_VARIABLE}).",
                stacklevel=2,
            )
        return application  # type: ignore[return-value]
    metadatas = app_metadata(modules)
    application = app_application(modules[-1], metadatas, duly_session, None, Duly)
    assert isinstance(application, Duly)
    return application


@async_fixture
async def duly_connection(duly_app: Duly) -> AsyncIterator[WorkflowConnection]:
    """`connect_workflows(duly_app)` entered: `row.start()`, handles, the app's registry and
    graph runtime reach this database, and workers started in the test serve its app."""
    from engine import connect_workflows

    async with connect_workflows(duly_app) as connection:
        yield connection


@pytest.fixture
def duly_drain(duly_session: async_sessionmaker[AsyncSession], duly_app: Duly) -> Drain:
    """`await duly_drain()` runs what is due now on this test's database, deterministically,
    with the app's registry and graph runtime."""
    return Drain(duly_session, duly_app)


@pytest.fixture
def duly_clock(duly_session: async_sessionmaker[AsyncSession]) -> Clock:
    """This test's database clock, to make days pass in milliseconds."""
    return Clock(duly_session)
