"""Tests of infra.embedded against a real embedded PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg

from infra.embedded import running_postmaster, start_embedded
from tests.helpers import REPO_ROOT, process_gone

KILL_DEADLINE = 10.0  # seconds for the watchdog to stop the server after a SIGKILL


def libpq_url(url: str) -> str:
    """The SQLAlchemy URL without its driver, as psycopg.connect wants it."""
    return url.replace("+psycopg", "", 1)


def test_start_connect_stop_deletes_temporary_dir() -> None:
    postgres = start_embedded()
    try:
        assert postgres.url.startswith("postgresql+psycopg://postgres@/postgres?host=")
        with psycopg.connect(libpq_url(postgres.url)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert postgres.log_path.exists()
    finally:
        postgres.stop()
    assert not postgres.data_dir.exists()
    assert postgres.watchdog is not None
    assert postgres.watchdog.poll() is not None
    postgres.stop()  # a second stop is a no-op


def test_restart_keeps_the_url_working() -> None:
    postgres = start_embedded()
    try:
        url, pid_before = postgres.url, postgres.postmaster_pid
        postgres.restart()
        assert postgres.url == url
        assert postgres.postmaster_pid not in (None, pid_before)
        with psycopg.connect(libpq_url(url)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        postgres.stop()


def test_running_postmaster_reads_pid_and_socket_and_ignores_stale_files(
    tmp_path: Path,
) -> None:
    postgres = start_embedded()
    try:
        running = running_postmaster(postgres.data_dir)
        assert running is not None
        assert running.pid == postgres.postmaster_pid
        assert (running.port, running.socket_dir) == (5432, postgres.socket_dir)
        assert running.url == postgres.conninfo_for("postgres")
        assert running.url is not None
        with psycopg.connect(running.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        postgres.stop()
    assert running_postmaster(postgres.data_dir) is None
    # A pid file left by a crash, naming a live process that is not PostgreSQL (this one).
    stale = tmp_path / "pgdata"
    stale.mkdir()
    lines = [str(os.getpid()), str(stale), "0", "5432", str(stale), "", "0", "ready"]
    (stale / "postmaster.pid").write_text("\n".join(lines) + "\n")
    assert running_postmaster(stale) is None
    (stale / "postmaster.pid").write_text("not a pid\n")
    assert running_postmaster(stale) is None
    assert running_postmaster(tmp_path / "nothing") is None


def test_tuned_for_tests_turns_durability_off() -> None:
    postgres = start_embedded(tuned_for_tests=True)
    try:
        with psycopg.connect(postgres.conninfo_for("postgres")) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
            assert conn.execute("SHOW full_page_writes").fetchone() == ("off",)
            assert conn.execute("SHOW max_connections").fetchone() == ("300",)
    finally:
        postgres.stop()


def test_watchdog_stops_the_server_when_its_owner_is_killed() -> None:
    script = textwrap.dedent(
        """
        import time
        from infra.embedded import running_postmaster, start_embedded

        postgres = start_embedded()
        print(postgres.data_dir, postgres.postmaster_pid, flush=True)
        time.sleep(60)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", script],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        data_dir, pid = owner.stdout.readline().split()
        postmaster_pid = int(pid)
        assert not process_gone(postmaster_pid)
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    deadline = time.monotonic() + KILL_DEADLINE
    while not (process_gone(postmaster_pid) and not Path(data_dir).exists()):
        assert time.monotonic() < deadline, "The watchdog left the server running."
        time.sleep(0.1)
