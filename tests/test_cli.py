"""`duly dev` as a developer runs it: a process with an embedded PostgreSQL, stopped by Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from functions.cli import build_parser
from infra.schema import load_app
from infra.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 30.0  # seconds for `duly dev` to answer /healthz (initdb included)
SETTLE = 10.0  # seconds for a step to show up in the output
EXIT_TIMEOUT = 15.0  # seconds for `duly dev` to exit after SIGINT


class Output:
    """The merged stdout and stderr of a process, collected by a thread as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def join(self) -> str:
        self._thread.join(timeout=5)
        return self.text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(condition: Callable[[], object], timeout: float, what: str, output: Output) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout} s; output:\n{output.text}")
        time.sleep(0.05)


def process_gone(pid: int) -> bool:
    """Whether pid has exited; a zombie counts (PID 1 in some containers never reaps)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def dev_env(data_dir: Path) -> dict[str, str]:
    """This environment without DULY_* settings (so no DULY_DATABASE_URL), data in data_dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DULY_")}
    return env | {"DULY_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def duly_dev(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Output, int, Path]]:
    """`python -m functions.cli dev` on a free port, data in a fresh nested dir; always reaped."""
    port = free_port()
    data_dir = tmp_path / "state" / "pgdata"
    process = subprocess.Popen(
        [sys.executable, "-m", "functions.cli", "dev", "--port", str(port)],
        cwd=REPO_ROOT,
        env=dev_env(data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(process)
    try:
        yield process, output, port, data_dir
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        output.join()
        assert process.stdout is not None
        process.stdout.close()


def test_duly_dev_serves_runs_the_demo_and_stops_cleanly_on_ctrl_c(
    duly_dev: tuple[subprocess.Popen[str], Output, int, Path],
) -> None:
    process, output, port, data_dir = duly_dev
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5)

    def healthy() -> bool:
        assert process.poll() is None, f"duly dev exited early; output:\n{output.text}"
        try:
            return bool(client.get("/healthz").json() == {"ok": True})
        except httpx.TransportError:
            return False

    def demo_run() -> dict[str, object]:
        [run] = client.get("/runs/onboarding").json()["runs"]
        assert (run["user_id"], run["email"]) == ("demo", "demo@example.com")
        return dict(run)

    with client:
        wait_for(healthy, READY_TIMEOUT, "/healthz", output)
        postmaster = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        assert psutil.pid_exists(postmaster)
        welcome = re.compile(r"onboarding\[\d+\] welcome ok in [\d.]+ ms, next .*check")
        wait_for(lambda: welcome.search(output.text), SETTLE, "the welcome step line", output)
        assert "send_email('demo@example.com', 'welcome')" in output.text
        assert demo_run()["next_step"] == "check"
        assert f"curl -X POST localhost:{port}/dev/clock" in output.text

        second = subprocess.run(
            [sys.executable, "-m", "functions.cli", "dev", "--port", str(free_port())],
            cwd=REPO_ROOT,
            env=dev_env(data_dir),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode == 2, second.stderr
        assert f"PostgreSQL already runs in {data_dir} (pid {postmaster})" in second.stderr
        assert healthy(), "a refused second duly dev disturbed the first"

        moved = client.post("/dev/clock", json={"days": 3})
        assert moved.status_code == 200, moved.text
        wait_for(lambda: demo_run()["nudges"] == 1, SETTLE, "the check step", output)
        assert re.search(r"onboarding\[\d+\] check ok", output.text)

    process.send_signal(signal.SIGINT)
    assert process.wait(EXIT_TIMEOUT) == 0, output.join()
    text = output.join()
    assert "Traceback" not in text, text
    assert process_gone(postmaster), "the embedded PostgreSQL outlived duly dev"


def test_duly_version_prints_the_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "functions.cli", "version"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert re.fullmatch(r"duly \d+\.\d+\.\d+\S*\n", result.stdout)


def test_bad_settings_are_refused_with_a_sentence(tmp_path: Path) -> None:
    env = {**os.environ, "DULY_PORT": "eighty", "DULY_DATA_DIR": str(tmp_path / "pg")}
    result = subprocess.run(
        [sys.executable, "-m", "functions.cli", "dev"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr == "duly: DULY_PORT must be a whole number, not 'eighty'.\n"
    assert not (tmp_path / "pg").exists()


def test_the_parser_knows_both_commands() -> None:
    parser = build_parser()
    dev = parser.parse_args(["dev", "--port", "9001", "--no-demo"])
    assert (dev.port, dev.no_demo, dev.host) == (9001, True, None)
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
