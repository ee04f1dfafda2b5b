"""Stop an embedded PostgreSQL once the process that started it is gone.

Spawned, detached, by `infra.embedded.start_embedded` as `python
watchdog.py <owner pid> <data dir> <delete: 0|1> <pg_ctl> [<user>]`.
It polls the owner (a SIGKILLed one runs no atexit hook); once it has exited
or is an unreaped zombie, it stops the server with `pg_ctl -m fast` as the
server's user and deletes the data dir if asked. Standard library and psutil
only: it runs by path, without the project on sys.path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

POLL_INTERVAL = 0.2  # seconds between checks of the owner
STOP_TIMEOUT = 30  # seconds for a fast shutdown before an immediate one


def owner_alive(owner: psutil.Process) -> bool:
    """Whether the owner still runs; a zombie counts as gone."""
    try:
        return bool(owner.is_running()) and owner.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_server(data_dir: Path, pg_ctl: str, user: str | None) -> None:
    """Stop the server fast, or immediately if a fast shutdown hangs."""
    if not (data_dir / "postmaster.pid").exists():
        return
    for mode in ("fast", "immediate"):
        command = [pg_ctl, "-D", str(data_dir), "-m", mode, "-w", "-t", str(STOP_TIMEOUT), "stop"]
        result = subprocess.run(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, user=user
        )
        if result.returncode == 0 or not (data_dir / "postmaster.pid").exists():
            return


def watch(owner_pid: int, data_dir: Path, delete: bool, pg_ctl: str, user: str | None) -> None:
    """Poll the owner until it is gone, then stop the server and clean up."""
    try:
        owner: psutil.Process | None = psutil.Process(owner_pid)
    except psutil.NoSuchProcess:
        owner = None
    while owner is not None and owner_alive(owner):
        if not data_dir.exists():
            return  # the owner stopped and deleted it: nothing to guard any more
        time.sleep(POLL_INTERVAL)
    stop_server(data_dir, pg_ctl, user)
    if delete:
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str]) -> None:
    """Parse the command line documented in the module docstring and watch."""
    owner_pid, data_dir, delete, pg_ctl = argv[:4]
    user = argv[4] if len(argv) > 4 and argv[4] else None
    watch(int(owner_pid), Path(data_dir), delete == "1", pg_ctl, user)


if __name__ == "__main__":
    main(sys.argv[1:])
