"""An app from `duly init`, built by `sam build`, run as Lambda runs it: small and complete.

Offline but for the package index: duly's wheel (`python -m build`), `duly init --wheel`
into a temporary folder, `sam build` (aws-sam-cli in a venv of its own: DULY_SAM, else `sam`
on PATH; it needs `python3.12` on PATH), then the bundle: its size, nothing of the project
but `src/`, and in a clean interpreter (`python3.12 -I -S`, the bundle and boto3 alone) the
five handlers import, a Function URL event (to `http`) starts a run, a Scheduler event wakes
it and a direct invoke delivers to it, on the suite's PostgreSQL with moto as AWS; and
`sam validate --lint` passes on duly's template and the app's.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import boto3
import pytest

from engine.base import settings as variables
from tests.aws_fakes import function_url_event
from tests.conftest import Database
from tests.helpers import DULY, REPO_ROOT

pytestmark = pytest.mark.timeout(600)  # a wheel, the scaffold and a sam build (pip downloads)

PACKAGE = "shipping"  # the scaffolded app's package
# The four, the HTTP API's, the migrate function, and the console's own URL (built whether or
# not deployed).
FUNCTIONS = (
    "PublishFunction",
    "ApiFunction",
    "WakeFunction",
    "DrainFunction",
    "DeliverFunction",
    "MigrateFunction",
    "ConsoleFunction",
)
MOST_MEGABYTES = 60  # a bundle's size, unzipped (boto3 is the runtime's; no cryptography)
NOT_IN_BUNDLE = ("tests", "bench", "docs", "wheels", ".venv", "venv", "template.yaml")
CALLER = "arn:aws:iam::123456789012:role/ci"  # the IAM caller of the Function URL
# What boto3 needs, all of it provided by Lambda's Python runtime.
LAMBDA_PROVIDES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six")
AWS = {
    "region_name": "us-east-1",
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
}


@dataclass(frozen=True)
class Built:
    """The scaffolded app, its bundles and the interpreter that runs them."""

    app: Path
    build: Path  # .aws-sam/build
    python: str  # python3.12
    runtime: Path  # boto3 and what it needs, as Lambda's runtime provides them

    def bundle(self, function: str = "PublishFunction") -> Path:
        return self.build / function


def find_tools() -> tuple[str, str]:
    """sam and python3.12, or a skip saying which cannot be found here."""
    named = variables.SAM.read()
    if named is not None and not os.access(named, os.X_OK):
        pytest.fail(f"DULY_SAM={named} is not an executable sam")
    sam = named or shutil.which("sam")
    python = working_python()
    if sam is None:
        pytest.skip("aws-sam-cli is not installed: set DULY_SAM or put sam on PATH (.ci/run does)")
    if python is None:
        pytest.skip("sam build needs python3.12 on PATH (Lambda's runtime), and there is none")
    return sam, python


def working_python() -> str | None:
    """The first `python3.12` on PATH that runs (a pyenv shim may not: sam build skips it too)."""
    for folder in os.environ["PATH"].split(os.pathsep):
        candidate = Path(folder) / "python3.12"
        if not os.access(candidate, os.X_OK):
            continue
        ran = subprocess.run([candidate, "-c", ""], capture_output=True, timeout=30)
        if ran.returncode == 0:
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """duly's wheel, built from this checkout as the README says."""
    find_tools()
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO_ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = dist.glob("duly-*.whl")
    return built


def sam_build(folder: Path, *options: str) -> Path:
    """`sam build` in `folder`, python3.12 on PATH; the build's folder."""
    sam, python = find_tools()
    env = {**os.environ, "PATH": f"{os.environ['PATH']}{os.pathsep}{Path(python).parent}"}
    done = subprocess.run(
        [sam, "build", *options], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / ".aws-sam" / "build"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Built:
    root = tmp_path_factory.mktemp("bundle")
    app = root / "shipping-app"
    init = [*DULY, "init", str(app), "--package", PACKAGE, "--wheel", str(wheel)]
    subprocess.run(init, check=True, capture_output=True, cwd=root)
    architecture = "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    build = sam_build(app, "--parameter-overrides", f"Architecture={architecture}")
    return Built(app, build, find_tools()[1], lambda_runtime(root / "runtime"))


def lambda_runtime(folder: Path) -> Path:
    """A folder of links to this venv's boto3 and its dependencies, and nothing else."""
    folder.mkdir()
    for name in LAMBDA_PROVIDES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (folder / source.name).symlink_to(source)
    return folder


def megabytes(folder: Path) -> float:
    """The files' size under `folder`, unzipped."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def drive(
    built: Built,
    command: str,
    *extra: str,
    env: dict[str, str] | None = None,
    function: str = "PublishFunction",
) -> Any:
    """Run the bundle driver on `function`'s bundle in a clean interpreter; its JSON answer."""
    driver = REPO_ROOT / "tests" / "bundle_driver.py"
    done = subprocess.run(
        [built.python, "-I", "-S", str(driver), str(built.bundle(function)), str(built.runtime),
         command, *extra],
        env=env if env is not None else {"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_bundle_is_small_and_holds_the_app_and_its_dependencies_only(
    built: Built,
) -> None:
    assert sorted(p.name for p in built.build.iterdir() if p.is_dir()) == sorted(FUNCTIONS)
    bundle = built.bundle()
    size = megabytes(bundle)
    print(f"bundle of {bundle.name}: {size:.1f} MB unzipped")
    assert size < MOST_MEGABYTES, f"{size:.1f} MB"
    top = {p.name for p in bundle.iterdir()}
    assert {PACKAGE, "engine", "functions", "infra", "sqlalchemy", "psycopg"} <= top
    assert {"migrations", "fastapi", "mangum", "alembic"} <= top
    assert not top & set(NOT_IN_BUNDLE), top & set(NOT_IN_BUNDLE)
    assert not list(bundle.rglob("pyvenv.cfg")), "a venv was copied in"
    assert "boto3" not in top, "boto3 is the runtime's, not the bundle's"
    assert "cryptography" not in top, "only an OpenID Connect issuer needs it: duly[oidc]"
    (metadata,) = bundle.glob("duly-*.dist-info")
    assert (metadata / "METADATA").is_file()


def test_every_handler_imports_in_a_clean_interpreter(built: Built) -> None:
    for function in FUNCTIONS:
        answer = drive(built, "imports", function=function)
        assert answer == {"missing": [], "outsiders": []}, function


@pytest.fixture
def wake_function(moto_endpoint: str) -> Iterator[str]:
    """A wake function in moto, whose invokes moto answers without running code (no Docker)."""

    def lambda_config(use_docker: bool) -> None:
        body = json.dumps({"lambda": {"use_docker": use_docker}}).encode()
        urlopen(Request(f"{moto_endpoint}/moto-api/config", data=body, method="POST")).close()

    lambda_config(False)
    aws = {**AWS, "endpoint_url": moto_endpoint}
    role = boto3.client("iam", **aws).create_role(RoleName="wake", AssumeRolePolicyDocument="{}")
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("handler.py", "def wake(event, context):\n    return event\n")
    arn = boto3.client("lambda", **aws).create_function(
        FunctionName="shipping-wake",
        Runtime="python3.12",
        Role=role["Role"]["Arn"],
        Handler="handler.wake",
        Code={"ZipFile": code.getvalue()},
    )["FunctionArn"]
    boto3.client("scheduler", **aws).create_schedule_group(Name="shipping")
    try:
        yield arn
    finally:
        lambda_config(True)  # moto's configuration is the process's: put the default back


def test_a_url_event_starts_a_run_a_schedule_wakes_it_and_an_invoke_delivers_to_it(
    built: Built, db: Database, moto_endpoint: str, wake_function: str, tmp_path: Path
) -> None:
    signup = {"where": {"email": "ada@example.com"}}
    start = {"row": {"email": "ada@example.com"}, "step": "welcome"}
    calls = [
        ["http", function_url_event("POST", "/workflows/signup/start", start, caller=CALLER)],
        ["wake", {"duly": "wake"}],  # what the safety-net schedule and every at() schedule send
        ["deliver", {"duly": "deliver", "workflow": "signup", **signup, "step": "confirm",
                     "args": {"code": "1234"}}],
        ["wake", {"duly": "wake"}],
    ]  # fmt: skip
    events = tmp_path / "events.json"
    events.write_text(json.dumps(calls))
    env = {
        "PATH": os.environ["PATH"],
        "DULY_APP": f"{PACKAGE}.workflows",
        "DULY_DATABASE_URL": db.url,
        "DULY_WAKE_FUNCTION_ARN": wake_function,
        "DULY_SCHEDULE_GROUP": "shipping",
        "DULY_SCHEDULER_ROLE_ARN": "arn:aws:iam::123456789012:role/scheduler",
        "DULY_ROLES": json.dumps({f"iam:{CALLER}": ["operator"]}),
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_DEFAULT_REGION": AWS["region_name"],
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    started, woken, delivered, finished = drive(built, "invoke", str(events), env=env)
    assert started["statusCode"] == 201, started
    assert json.loads(started["body"]) == {"workflow": "signup", "key": "1", "step": "welcome"}
    assert woken["steps"] == 1, woken  # welcome ran; the run waits for confirm
    assert (delivered["taken"], delivered["step"]) == (1, "confirm"), delivered
    assert finished["steps"] == 1, finished
    rows = db.sql("SELECT status, next_step FROM signup")
    assert rows == [("confirmed with 1234", None)]


def test_dulys_own_template_bundles_its_wheel_and_dependencies_only(
    wheel: Path, tmp_path: Path
) -> None:
    requirements = (REPO_ROOT / "deploy" / "requirements.txt").read_text().splitlines()
    assert requirements[-1] == f"./dist/{wheel.name}", "deploy/ names the version pyproject builds"
    shutil.copy(REPO_ROOT / "template.yaml", tmp_path)
    shutil.copytree(REPO_ROOT / "deploy", tmp_path / "deploy")
    (tmp_path / "dist").mkdir()
    shutil.copy(wheel, tmp_path / "dist")
    bundle = sam_build(tmp_path) / "PublishFunction"
    size = megabytes(bundle)
    print(f"duly's own bundle: {size:.1f} MB unzipped")
    assert size < MOST_MEGABYTES, f"{size:.1f} MB"
    top = {p.name for p in bundle.iterdir()}
    assert {"engine", "functions", "infra", "sqlalchemy"} <= top
    assert not top & {*NOT_IN_BUNDLE, "dist", "deploy", "README.md", "pyproject.toml"}
    assert (bundle / "functions" / "examples.py").is_file(), "the example app is in the wheel"


def test_sam_validate_lint_passes_on_dulys_template_and_the_apps(built: Built) -> None:
    sam, _ = find_tools()
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    for folder in (REPO_ROOT, built.app):
        done = subprocess.run(
            [sam, "validate", "--lint", "--template-file", str(folder / "template.yaml")],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "is a valid SAM Template" in done.stdout + done.stderr, folder
