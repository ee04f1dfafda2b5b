"""The console in a real browser: `duly dev`'s app on a real PostgreSQL, driven by Playwright.

One console serves the whole browser session: the dev app (API, console,
worker, dev routes) over a fresh database holding the example workflows and
the example graph, on uvicorn in a thread of its own, so Playwright's sync
API owns the test's thread. Tests share that database and so each works on
runs, events and graphs it created itself.

The browser is Debian's `chromium-headless-shell` (installed by `.ci/run`);
`playwright install` cannot download one on our machines. Screenshots go to
`screenshots/` (ignored by git), for a look at a failure; the documentation's
are made by `python docs/screenshots.py` into `docs/images/`.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvicorn
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Page

from functions.local.dev import create_dev_app, install_example_graph
from infra.testing.pytest_plugin import Server, fresh_database
from tests.helpers import examples_configured

CHROMIUM = Path("/usr/lib/chromium/chromium-headless-shell")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "screenshots"
STARTUP = 30.0
FAST_WORKER = {"max_idle_interval": timedelta(seconds=0.5)}


def example_app() -> ModuleType:
    """`functions.examples`, imported when first used, not when this file is collected
    (see `tests.helpers.examples_configured`)."""
    return importlib.import_module("functions.examples")


@dataclass
class LiveConsole:
    """The dev app served on a free loopback port from a thread with its own event loop."""

    server: Server
    url: str = ""
    database_url: str = ""
    _ready: threading.Event = field(default_factory=threading.Event)
    _uvicorn: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _failure: BaseException | None = None
    application: Any = None  # the served app's application, once started

    def start(self) -> None:
        # The thread serves in a copy of this context: the application that
        # examples_configured() made current here (its registry, its graph runtime).
        here = contextvars.copy_context()
        self._thread = threading.Thread(target=here.run, args=(self._run,), name="console")
        self._thread.daemon = True
        self._thread.start()
        if not self._ready.wait(STARTUP):
            raise AssertionError("the console did not start in time")
        if self._failure is not None:
            raise AssertionError("the console failed to start") from self._failure

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(STARTUP)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test thread by start()
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        async with fresh_database(self.server) as database:
            Session = await database.create(example_app().Base.metadata)
            self.database_url = database.url
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            app = create_dev_app(Session, worker_options=FAST_WORKER)
            config = uvicorn.Config(app, log_config=None, ws="none", lifespan="on")
            self._uvicorn = uvicorn.Server(config)
            task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
            deadline = time.monotonic() + STARTUP
            while not self._uvicorn.started:
                if task.done() or time.monotonic() > deadline:
                    raise AssertionError("uvicorn did not start")
                await asyncio.sleep(0.01)
            self.application = app.state.application
            with app.state.application.current():  # as a request of the app's would
                await install_example_graph()
            self.url = f"http://127.0.0.1:{port}"
            self._ready.set()
            await task
            sock.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The browser tests run after every other test of the session.

    Playwright's sync API keeps its event loop running on the main thread from
    the first browser test to the end of the session, where no later
    pytest-asyncio test could run its own (`pytest tests/browser tests/...`).
    """
    here = Path(__file__).parent
    items.sort(key=lambda item: here in Path(str(item.path)).parents)


@pytest.fixture(scope="session")
def console(server: Server) -> Iterator[LiveConsole]:
    """`duly dev`'s app with the examples configured as `duly dev` configures them."""
    with examples_configured():
        live = LiveConsole(server)
        try:
            live.start()
            yield live
        finally:
            live.stop()


@pytest.fixture(scope="session")
def base_url(console: LiveConsole) -> str:
    """pytest-playwright's base URL: `page.goto("/console")` opens the live console."""
    return console.url


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium-headless-shell")
    return {**browser_type_launch_args, "executable_path": str(CHROMIUM), "headless": True}


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """Where the browser tests write their screenshots (ignored by git)."""
    SCREENSHOTS.mkdir(exist_ok=True)
    return SCREENSHOTS


# What an accessibility check refuses: axe-core's two worst impacts.
REFUSED_IMPACTS = frozenset({"serious", "critical"})


@pytest.fixture(scope="session")
def accessible() -> Callable[[Page], None]:
    """A check that the page, as it stands, has no serious or critical axe-core violation."""
    axe = Axe()

    def check(page: Page) -> None:
        results = axe.run(page)
        refused = [v for v in results.response["violations"] if v["impact"] in REFUSED_IMPACTS]
        if refused:
            report = "\n".join(
                f"{v['id']} ({v['impact']}): {v['help']} at "
                + ", ".join(", ".join(n["target"]) for n in v["nodes"][:5])
                for v in refused
            )
            raise AssertionError(f"{page.url} has accessibility violations:\n{report}")

    return check
