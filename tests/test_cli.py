"""`duly dev` as a developer runs it: a process with an embedded PostgreSQL, stopped by Ctrl-C."""

from __future__ import annotations

import importlib
import re
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from functions.cli import build_parser
from functions.local.server import HEAD_TIMEOUT
from infra.schema import load_app
from infra.settings import Settings
from tests.helpers import (
    EXIT_TIMEOUT,
    REPO_ROOT,
    Output,
    dev_env,
    duly_process,
    free_port,
    process_gone,
    run_duly,
    wait_for,
    wait_healthy,
)

SETTLE = 10.0  # seconds for a step to show up in the output


@pytest.fixture
def duly_dev(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Output, int, Path]]:
    """`duly dev` on a free port, data in a fresh nested dir; always reaped."""
    port = free_port()
    data_dir = tmp_path / "state" / "pgdata"
    with duly_process("dev", "--port", str(port), cwd=REPO_ROOT, env=dev_env(data_dir)) as (
        process,
        output,
    ):
        yield process, output, port, data_dir


def test_duly_dev_serves_runs_the_demo_and_stops_cleanly_on_ctrl_c(
    duly_dev: tuple[subprocess.Popen[str], Output, int, Path],
) -> None:
    process, output, port, data_dir = duly_dev
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5)

    def demo_run() -> dict[str, object]:
        [listed] = client.get("/workflows/onboarding/runs").json()["runs"]
        run = listed["row"]
        assert (run["user_id"], run["email"]) == ("demo", "demo@example.com")
        return dict(run)

    with client:
        wait_healthy(process, output, client)
        postmaster = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        assert psutil.pid_exists(postmaster)
        welcome = re.compile(r"onboarding\[\d+\] welcome ok in [\d.]+ ms, next .*check")
        wait_for(lambda: welcome.search(output.text), SETTLE, "the welcome step line", output)
        assert "send_email('demo@example.com', 'welcome')" in output.text
        assert demo_run()["next_step"] == "check"
        assert (
            f"duly dev: open http://127.0.0.1:{port}/console (or /workflows/onboarding/runs,"
            in output.text
        )
        assert f"curl -X POST localhost:{port}/dev/clock" in output.text
        assert "database clock:" not in output.text  # a fresh database's clock is not moved
        # DULY_APP unset: duly dev says it serves duly's examples, and how to name yours.
        assert (
            "duly: DULY_APP is not set: using duly's examples (functions.examples); set DULY_APP "
            "to the module that maps your workflows (DULY_APP=myapp.workflows)." in output.text
        )

        second = run_duly("dev", "--port", str(free_port()), cwd=REPO_ROOT, env=dev_env(data_dir))
        assert second.returncode == 2, second.stderr
        assert f"PostgreSQL already runs in {data_dir} (pid {postmaster})" in second.stderr
        assert client.get("/healthz").json() == {"ok": True}, "a refused second duly dev hurt"

        moved = client.post("/dev/clock", json={"days": 3})
        assert moved.status_code == 200, moved.text
        wait_for(lambda: demo_run()["nudges"] == 1, SETTLE, "the check step", output)
        assert re.search(r"onboarding\[\d+\] check ok", output.text)

    process.send_signal(signal.SIGINT)
    assert process.wait(EXIT_TIMEOUT) == 0, output.join()
    text = output.join()
    assert "Traceback" not in text, text
    assert process_gone(postmaster), "the embedded PostgreSQL outlived duly dev"


def test_duly_dev_closes_a_connection_whose_request_head_is_late(
    duly_dev: tuple[subprocess.Popen[str], Output, int, Path],
) -> None:
    """One socket sends nothing, another a request head a byte at a time: each is closed
    within HEAD_TIMEOUT of connecting, and the server answers others meanwhile."""
    process, output, port, _ = duly_dev
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5) as client:
        wait_healthy(process, output, client)
        idle = socket.create_connection(("127.0.0.1", port))
        slow = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Never-Done: "
        closed: dict[str, float] = {}
        sent = 0
        with idle, slow:
            while len(closed) < 2 and time.monotonic() < started + HEAD_TIMEOUT + 5:
                drip = head[sent % len(head) :][:1]
                for name, sock, byte in (("idle", idle, b""), ("slow", slow, drip)):
                    if name not in closed and not still_open(sock, byte):
                        closed[name] = time.monotonic() - started
                sent += 1
                assert client.get("/healthz").json() == {"ok": True}
                open_ones = [s for n, s in (("idle", idle), ("slow", slow)) if n not in closed]
                select.select(open_ones, [], [], 0.5)  # until one is closed, or the next drip
    assert set(closed) == {"idle", "slow"}, closed
    assert all(HEAD_TIMEOUT - 1 < took < HEAD_TIMEOUT + 3 for took in closed.values()), closed


def still_open(sock: socket.socket, drip: bytes) -> bool:
    """Whether the server keeps `sock` open; a slow client's next byte sent first."""
    try:
        if drip:
            sock.send(drip)
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable or sock.recv(1024) != b""
    except OSError:  # reset: the server closed it
        return False


def test_duly_version_prints_the_version(tmp_path: Path) -> None:
    result = run_duly("version", cwd=REPO_ROOT, env=dev_env(tmp_path / "pg"))
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"duly \d+\.\d+\.\d+\S*\n", result.stdout)


def test_bad_settings_are_refused_with_a_sentence(tmp_path: Path) -> None:
    env = dev_env(tmp_path / "pg", DULY_PORT="eighty")
    result = run_duly("dev", cwd=REPO_ROOT, env=env)
    assert result.returncode == 2
    assert result.stderr == "duly: DULY_PORT must be a whole number, not 'eighty'.\n"
    assert not (tmp_path / "pg").exists()


def test_the_parser_knows_every_command() -> None:
    parser = build_parser()
    dev = parser.parse_args(["dev", "--port", "9001", "--no-demo"])
    assert (dev.port, dev.no_demo, dev.host, dev.reset_clock) == (9001, True, None, False)
    assert parser.parse_args(["dev", "--reset-clock"]).reset_clock is True
    assert parser.parse_args(["db-url"]).command.__name__ == "print_db_url"
    assert parser.parse_args(["version"]).command.__name__ == "print_version"


def test_settings_read_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "DULY_DATABASE_URL": "postgres://u:p%40ss@db.example:5433/app",
            "DULY_APP": "myapp.workflows",
            "DULY_PORT": "9000",
            "DULY_DATA_DIR": str(tmp_path / "pg"),
        }
    )
    assert settings.database_url == "postgresql+psycopg://u:p%40ss@db.example:5433/app"
    assert (settings.app_module, settings.host, settings.port) == (
        "myapp.workflows",
        "127.0.0.1",
        9000,
    )
    assert settings.data_dir == tmp_path / "pg"
    defaults = Settings.from_env({})
    assert (defaults.database_url, defaults.app_module) == (None, "functions.examples")
    assert defaults.data_dir == Path.cwd() / ".duly" / "pgdata"
    given = Settings.from_env({"DULY_DATABASE_URL": "postgresql://localhost/x"})
    assert given.database_url == "postgresql+psycopg://localhost/x"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DULY_PORT", "80.5", "DULY_PORT must be a whole number, not '80.5'."),
        ("DULY_PORT", "70000", "DULY_PORT must be between 1 and 65535, not 70000."),
        ("DULY_DATABASE_URL", "mysql://localhost/x", "DULY_DATABASE_URL uses mysql://"),
        ("DULY_DATABASE_URL", "not a url", "DULY_DATABASE_URL is not a database URL"),
    ],
)
def test_bad_settings_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings.from_env({name: value})


def test_load_app_finds_the_example_metadata_and_refuses_a_missing_module() -> None:
    from functions import examples

    assert load_app("functions.examples") == [examples.Base.metadata]
    with pytest.raises(LookupError, match="No module named 'no_such_app'"):
        load_app("no_such_app")


def test_load_app_finds_workflows_its_module_imports_from_siblings_loaded_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test imports `shopx.orders` before the plugin loads `shopx.app`: its tables are found."""
    package = tmp_path / "shopx"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "orders.py").write_text(
        "from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column\n"
        "from engine import Workflow\n"
        "class Base(DeclarativeBase):\n    pass\n"
        "class ShopxOrder(Base, Workflow):\n"
        "    __tablename__ = 'shopx_orders'\n"
        "    id: Mapped[int] = mapped_column(primary_key=True)\n"
    )
    (package / "app.py").write_text("from shopx.orders import Base, ShopxOrder\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    orders = importlib.import_module("shopx.orders")  # as a test module would, first
    assert load_app("shopx.app") == [orders.Base.metadata]
