"""Worker processes for tests: started with `python -m tests.processes.worker`, always reaped."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 20.0  # seconds for a worker process to start
WORKER_MODULE = "tests.processes.worker"


class WorkerProcesses:
    """Starts worker processes on a test database and kills whatever is left at the end."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks
        self.started: list[subprocess.Popen[str]] = []

    def start(
        self, url: str, *args: str, module: str = WORKER_MODULE, log: Path | None = None
    ) -> subprocess.Popen[str]:
        """`python -m module url *args`, once it said "ready"; its stderr to `log` if given."""
        env = {**os.environ, "DULY_TEST_MARKS": str(self.marks), "PYTHONPATH": str(REPO_ROOT)}
        with contextlib.ExitStack() as files:
            stderr = files.enter_context(open(log, "w")) if log is not None else None
            process = subprocess.Popen(
                [sys.executable, "-m", module, url, *args],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.started.append(process)
        assert process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.1)
            if ready and process.stdout.readline().strip() == "ready":
                return process
            if process.poll() is not None:
                raise RuntimeError(f"worker process exited with {process.returncode}")
        raise TimeoutError("worker process did not become ready")

    def stop(self, process: subprocess.Popen[str], timeout: float = 20.0) -> int:
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout)

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(5)
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[WorkerProcesses]:
    processes = WorkerProcesses(tmp_path)
    try:
        yield processes
    finally:
        processes.kill_all()
