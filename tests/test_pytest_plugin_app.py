"""The plugin's fixtures give a test its app's event registry and graph runtime.

Run as a user would, in a folder of its own: the app module maps an outbox, graph
tables and a subject, names its `graph_runtime` and registers a handler on the
import-time registry; the test uses only the plugin's fixtures, and the graph's
notification reaches the handler through the outbox, as under `duly dev` or Lambda.
Without `duly_app`, the same test is warned that the app's registry and runtime are not
its own, rather than left to find its handler silent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra.testing.pytest_plugin import Server

REPO_ROOT = Path(__file__).resolve().parents[1]

APP = """\
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import GraphRuntime, GraphSubject, declare_engine_tables, get_event_registry


class Base(DeclarativeBase):
    pass


tables = declare_engine_tables(Base, graphs=True)


class Claim(Base, GraphSubject):
    __tablename__ = "claims"

    id: Mapped[int] = mapped_column(primary_key=True)


graph_runtime = GraphRuntime(tables.graphs)
heard = []


async def assigned(event):
    heard.append(event.payload["state_code"])


get_event_registry().register("duly.graph.state_assignment", assigned)
"""

TEST = """\
from engine import get_graph_runtime, save_design, activate_template

from notified.app import Claim, heard

DESIGN = {
    "name": "claims",
    "nodes": [
        {"id": "start", "type": "start", "name": "Start", "x": 0, "y": 0},
        {"id": "review", "type": "state", "name": "Review", "x": 0, "y": 1,
         "stateCode": "review", "assigneeUserIds": ["ann"]},
        {"id": "end", "type": "end", "name": "End", "x": 0, "y": 2},
    ],
    "stateChoices": ["review"],
    "connections": [
        {"source": "start", "target": "review"},
        {"source": "review", "target": "end"},
    ],
}


async def test_a_graph_notification_reaches_the_apps_handler(
    duly_session, duly_connection, duly_drain
):
    runtime = get_graph_runtime()
    async with runtime.engine.begin() as conn:
        saved = await save_design(conn, runtime.tables, DESIGN, runtime.conditions.names())
        await activate_template(conn, runtime.tables, saved.template_id, [])
    async with duly_session.begin() as session:
        claim = Claim()
        session.add(claim)
    await runtime.submit(claim, "sam", template_name="claims")
    assert await duly_drain() >= 1  # the outbox's row, routed
    assert heard == ["review"]
"""


def run_project(server: Server, folder: Path, ini: str) -> subprocess.CompletedProcess[str]:
    """The notified app and its test in `folder`, run by pytest with these ini lines."""
    (folder / "notified").mkdir()
    (folder / "notified" / "__init__.py").write_text("")
    (folder / "notified" / "app.py").write_text(APP)
    (folder / "tests").mkdir()
    (folder / "tests" / "test_notified.py").write_text(TEST)
    (folder / "pyproject.toml").write_text(
        f'[tool.pytest.ini_options]\nasyncio_mode = "auto"\n{ini}'
        'asyncio_default_fixture_loop_scope = "function"\n'
    )
    # This checkout's duly (the plugin comes through the entry point), none of its settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DULY_", "PYTEST_"))}
    env.update(PYTHONPATH=str(REPO_ROOT), DULY_TEST_DATABASE_URL=server.base_url)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_the_plugin_configures_the_apps_registry_and_graph_runtime(
    server: Server, tmp_path: Path
) -> None:
    result = run_project(server, tmp_path, 'duly_app = ["notified.app"]\n')
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "duly_app is not set" not in result.stdout


def test_without_duly_app_the_test_is_warned_of_the_apps_unused_parts(
    server: Server, tmp_path: Path
) -> None:
    result = run_project(server, tmp_path, "")
    assert result.returncode == 1, result.stdout + result.stderr  # its handler never ran
    assert "duly_app is not set, so notified.app.graph_runtime are not" in result.stdout
    assert "Name the app module in the ini option duly_app" in result.stdout
