"""What a new user tripped on with `duly dev` and an app of their own, each now a test.

The app lives in a temporary folder, outside this repository, and `duly dev`
runs from there as the `duly` script would (the folder is not on sys.path
unless duly puts it there).
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.helpers import (
    EXIT_TIMEOUT,
    REPO_ROOT,
    Output,
    dev_env,
    duly_process,
    free_port,
    run_duly,
    wait_for,
    wait_healthy,
)

SETTLE = 5.0  # seconds for a line to reach the collected output
FLOWS = """
from __future__ import annotations

from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step


class Base(DeclarativeBase):
    pass


# duly's tables first, as an app with a models module has them: mapped before Invoice.
engine_tables = declare_engine_tables(Base)


class Invoice(Base, Workflow):
    __tablename__ = "invoice"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]

    @step
    async def send(self):
        return None
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A folder with a package `myapp` whose `myapp.flows` maps one workflow, `invoice`
    (after duly's own tables, which the banner does not offer as the app's)."""
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "flows.py").write_text(textwrap.dedent(FLOWS))
    return tmp_path


@contextlib.contextmanager
def duly_dev(app_dir: Path, *flags: str) -> Iterator[tuple[httpx.Client, Output, int]]:
    """`duly dev --no-demo` of myapp.flows from its folder, until Ctrl-C at the block's end."""
    port = free_port()
    env = dev_env(app_dir / ".duly" / "pgdata", DULY_APP="myapp.flows")
    command = ("dev", "--no-demo", "--port", str(port), *flags)
    with duly_process(*command, cwd=app_dir, env=env) as (process, output):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            wait_healthy(process, output, client)
            yield client, output, port
        process.send_signal(signal.SIGINT)
        assert process.wait(EXIT_TIMEOUT) == 0, output.join()
        assert "Traceback" not in output.join(), output.text


def test_an_app_of_ones_own_runs_from_its_folder_and_its_database_is_reachable(
    app_dir: Path,
) -> None:
    data_dir = app_dir / ".duly" / "pgdata"
    env = dev_env(data_dir, DULY_APP="myapp.flows")
    with duly_dev(app_dir) as (client, output, port):
        workflows = client.get("/workflows").json()["workflows"]
        assert [(w["name"], w["engine_owned"]) for w in workflows] == [
            ("duly_outbox", True),
            ("invoice", False),
        ]
        # The banner points at the app's own (first) workflow, not the example's.
        url = f"http://127.0.0.1:{port}"
        banner = f"duly dev: open {url}/console (or /workflows/invoice/runs, /workflows, /docs)\n"
        wait_for(lambda: "database: " in output.text, SETTLE, "the database line", output)
        assert banner in output.text
        assert "DULY_APP is not set" not in output.text
        # A user's own app has the clock but none of the examples' routes.
        example = client.post("/dev/onboarding", json={"user_id": "u", "email": "e"})
        assert example.status_code == 404
        [url] = re.findall(r"^database: (\S+)$", output.text, re.MULTILINE)
        assert url == f"postgresql://postgres@/postgres?host={data_dir.resolve()}"

        printed = run_duly("db-url", cwd=app_dir, env=env)
        assert (printed.returncode, printed.stdout, printed.stderr) == (0, f"{url}\n", "")
        with psycopg.connect(url) as conn:  # from outside duly dev, as psql would
            conn.execute("INSERT INTO invoice (customer) VALUES ('acme')")
        [run] = client.get("/workflows/invoice/runs").json()["runs"]
        assert run["row"]["customer"] == "acme"

    stopped = run_duly("db-url", cwd=app_dir, env=env)
    assert (stopped.returncode, stopped.stdout) == (1, "")
    assert stopped.stderr == (
        f"duly: No embedded PostgreSQL runs in {data_dir.resolve()}: start duly dev, or set "
        "DULY_DATA_DIR to the directory the running one uses.\n"
    )


def test_a_clock_moved_in_an_earlier_run_is_told_at_start_and_can_be_reset(
    app_dir: Path,
) -> None:
    with duly_dev(app_dir) as (client, _, _):
        moved = client.post("/dev/clock", json={"days": 2})
        assert moved.json() == {"shift_seconds": 2 * 24 * 3600.0}

    with duly_dev(app_dir) as (client, output, port):
        told = (
            "database clock: 2 days, 0:00:00 ahead, moved in an earlier run; reset it with "
            f"curl -X POST localhost:{port}/dev/clock/reset or duly dev --reset-clock.\n"
        )
        wait_for(lambda: told in output.text, SETTLE, "the clock's shift", output)
        assert client.post("/dev/clock", json={}).json() == {"shift_seconds": 2 * 24 * 3600.0}

    with duly_dev(app_dir, "--reset-clock") as (client, output, _):
        reset = "database clock: reset (it was 2 days, 0:00:00 ahead).\n"
        wait_for(lambda: reset in output.text, SETTLE, "the clock's reset", output)
        assert client.post("/dev/clock", json={}).json() == {"shift_seconds": 0.0}

    with duly_dev(app_dir) as (_, output, _):
        wait_for(lambda: "database: " in output.text, SETTLE, "the banner", output)
        assert "database clock:" not in output.text


def test_a_busy_port_is_named_with_the_way_out(tmp_path: Path) -> None:
    data_dir = tmp_path / "pgdata"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        by_flag = run_duly("dev", "--port", str(port), cwd=REPO_ROOT, env=dev_env(data_dir))
        env = dev_env(data_dir, DULY_PORT=str(port))
        by_variable = run_duly("dev", cwd=REPO_ROOT, env=env)
    for result in (by_flag, by_variable):
        assert result.returncode == 2
        assert result.stderr == (
            f"duly: port {port} on 127.0.0.1 is in use: pass --port or set DULY_PORT.\n"
        )
    assert not data_dir.exists(), "PostgreSQL was started for a server that could not serve"
