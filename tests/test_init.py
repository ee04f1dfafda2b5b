"""`duly init`: the scaffold it writes and what it refuses; the app-layout check at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.api import lint_file
from cfnlint.decode.cfn_yaml import load

from engine.base.errors import ConfigurationError
from functions.cli.scaffold_template import SCAFFOLD_TEMPLATE, app_template
from functions.lambdas.runtime import Runtime
from infra.schema.app_layout import DULY_PACKAGES, check_app_layout
from infra.testing.pytest_plugin import Server
from tests.aws_fakes import settings_for
from tests.conftest import Database
from tests.helpers import REPO_ROOT, dev_env, run_duly

HANDLERS = {
    "PublishFunction": "functions.lambdas.handlers.publish",
    "WakeFunction": "functions.lambdas.handlers.wake",
    "DrainFunction": "functions.lambdas.handlers.drain",
    "DeliverFunction": "functions.lambdas.handlers.deliver",
}
OPTIONAL_HANDLERS = {  # the HTTP API, the migrate function, the console's URL (PublicConsole)
    "ApiFunction": "functions.lambdas.handlers.http",
    "MigrateFunction": "functions.lambdas.migrate.on_deploy",
    "ConsoleFunction": "functions.lambdas.handlers.http",
}
SCAFFOLD = {
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "template.yaml",
    "src/requirements.txt",
    "src/migrations/README.md",
    "src/parcels/__init__.py",
    "src/parcels/workflows.py",
    "tests/test_workflows.py",
}
WHY = "a Lambda bundle puts dependencies beside the app's code in one directory"


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_init_writes_an_app_whose_template_runs_dulys_handlers_on_its_own_code(
    tmp_path: Path,
) -> None:
    wheel = tmp_path / "duly-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    app = tmp_path / "parcels"
    done = run_duly("init", str(app), "--wheel", str(wheel), cwd=tmp_path, env=dev_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert files_under(app) == SCAFFOLD | {f"wheels/{wheel.name}"}
    template = load(str(app / "template.yaml"))
    assert template["Globals"]["Function"]["CodeUri"] == "src/"
    assert template["Globals"]["Function"]["Runtime"] == "python3.12"
    assert template["Parameters"]["AppModule"]["Default"] == "parcels.workflows"
    assert template["Parameters"]["MigrationsDirectory"]["Default"] == "migrations"
    assert template["Parameters"]["Architecture"]["AllowedValues"] == ["x86_64", "arm64"]
    handlers = {
        name: resource["Properties"]["Handler"]
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Serverless::Function"
    }
    assert handlers == {**HANDLERS, **OPTIONAL_HANDLERS}
    matches = lint_file(app / "template.yaml")
    assert matches == [], "\n".join(str(match) for match in matches)
    requirements = (app / "src" / "requirements.txt").read_text().splitlines()
    assert requirements[-1] == f"./wheels/{wheel.name}"  # sam build runs in the app's folder
    written = "".join((app / name).read_text() for name in SCAFFOLD)
    for placeholder in ("package", "duly_source", "duly_install"):  # CloudFormation's own
        assert "{{" + placeholder + "}}" not in written  # {{resolve:...}} stay as they are


def test_the_scaffolds_own_tests_pass_with_dulys_pytest_plugin(
    tmp_path: Path, server: Server
) -> None:
    app = tmp_path / "parcels"
    assert run_duly("init", str(app), cwd=tmp_path, env=dev_env(tmp_path)).returncode == 0
    env = {**dev_env(tmp_path), "DULY_TEST_DATABASE_URL": server.base_url}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_init_refuses_a_folder_that_is_not_empty_and_writes_nothing(tmp_path: Path) -> None:
    app = tmp_path / "parcels"
    app.mkdir()
    (app / "notes.txt").write_text("mine")
    done = run_duly("init", str(app), cwd=tmp_path, env=dev_env(tmp_path))
    assert done.returncode == 2
    assert "is not empty" in done.stderr
    assert files_under(app) == {"notes.txt"}


@pytest.mark.parametrize("name", DULY_PACKAGES)
def test_init_refuses_a_package_named_like_one_of_dulys(tmp_path: Path, name: str) -> None:
    app = tmp_path / "app"
    done = run_duly("init", str(app), "--package", name, cwd=tmp_path, env=dev_env(tmp_path))
    assert done.returncode == 2
    assert f"cannot be named {name!r}" in done.stderr and WHY in done.stderr
    assert not app.exists()


def test_init_names_the_package_after_the_folder_and_refuses_a_folder_named_functions(
    tmp_path: Path,
) -> None:
    done = run_duly("init", str(tmp_path / "functions"), cwd=tmp_path, env=dev_env(tmp_path))
    assert done.returncode == 2 and WHY in done.stderr
    done = run_duly("init", str(tmp_path / "my-app"), cwd=tmp_path, env=dev_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "my-app" / "src" / "my_app" / "workflows.py").is_file()


def test_init_refuses_a_wheel_that_is_not_dulys(tmp_path: Path) -> None:
    other = tmp_path / "other-1.0-py3-none-any.whl"
    other.write_bytes(b"")
    args = ("init", str(tmp_path / "app"), "--wheel", str(other))
    done = run_duly(*args, cwd=tmp_path, env=dev_env(tmp_path))
    assert done.returncode == 2 and "python -m build --wheel" in done.stderr


# -- the same check at start: duly dev, every command that imports the app, Lambda ------------


def test_an_app_inside_one_of_dulys_packages_is_refused_but_dulys_example_app(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigurationError, match="inside a package named 'functions'"):
        check_app_layout("functions.flows", tmp_path)
    with pytest.raises(ConfigurationError, match=WHY):
        check_app_layout("engine", tmp_path)
    check_app_layout("functions.examples", tmp_path)
    check_app_layout("flows.app", tmp_path)
    check_app_layout("functions.examples", REPO_ROOT)  # duly's own checkout: its own folders


def test_a_folder_of_the_apps_root_that_shadows_dulys_package_is_refused(tmp_path: Path) -> None:
    (tmp_path / "infra").mkdir()
    with pytest.raises(ConfigurationError, match="shadows duly's package 'infra'"):
        check_app_layout("flows", tmp_path)


def test_a_folder_beside_the_apps_package_that_shadows_dulys_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    (source / "parcels_app").mkdir(parents=True)
    (source / "parcels_app" / "__init__.py").write_text("")
    (source / "engine").mkdir()
    monkeypatch.syspath_prepend(str(source))
    with pytest.raises(ConfigurationError, match="shadows duly's package 'engine'"):
        check_app_layout("parcels_app.workflows", tmp_path)


def test_duly_dev_and_the_commands_refuse_a_folder_that_shadows_dulys(tmp_path: Path) -> None:
    (tmp_path / "functions").mkdir()
    (tmp_path / "flows.py").write_text("")
    env = dev_env(tmp_path / "data", DULY_APP="flows", DULY_DATABASE_URL="postgresql://x/y")
    for command in (("dev", "--port", "0"), ("status",), ("migrate", "--sql")):
        done = run_duly(*command, cwd=tmp_path, env=env)
        assert done.returncode == 2, (command, done.stderr)
        assert "shadows duly's package 'functions'" in done.stderr, command
    assert not (tmp_path / "data").exists(), "duly dev started nothing"


def test_the_lambda_runtime_refuses_an_app_in_dulys_packages(db: Database) -> None:
    rt = Runtime(settings_for(db, app_module="infra.flows"))
    try:
        with pytest.raises(ConfigurationError, match="inside a package named 'infra'"):
            rt.run(rt.container())
    finally:
        rt.close()


def test_the_scaffolds_template_is_dulys_own_made_an_apps() -> None:
    """One template: the scaffold's copy is template.yaml with the app's code, module,
    revisions and description (`python -m functions.cli.scaffold_template` writes it)."""
    root = (REPO_ROOT / "template.yaml").read_text()
    assert SCAFFOLD_TEMPLATE.read_text() == app_template(root)
