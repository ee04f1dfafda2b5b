"""`duly dev --serverless`: the AWS loop on this machine, as a user runs it.

No worker in the app: steps run in wake invocations (logged by the firer),
a `wake_in` step leaves a schedule in moto, and moving the database clock
past it makes the firer invoke wake with the schedule's own input.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import httpx
import psycopg
import pytest

from functions.local.serverless import POLL_SECONDS, LocalContext, describe_result, parse_at
from tests.helpers import (
    EXIT_TIMEOUT,
    REPO_ROOT,
    Output,
    dev_env,
    duly_process,
    free_port,
    process_gone,
    wait_for,
    wait_healthy,
)

SETTLE = 10.0  # seconds for a wake invocation to show up in the output
GROUP, SCHEDULE = "duly-dev", "duly-wake"
STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC"
MOTO = re.compile(r"EventBridge Scheduler: moto at (http://127\.0\.0\.1:\d+) ")
# Importing moto fails, as where only duly[local] is installed.
WITHOUT_MOTO = "import sys; sys.modules['moto'] = None\nfrom functions.cli import main\nmain()"
# A venv with duly but not its aws extra: boto3 and botocore cannot be imported.
WITHOUT_BOTO3 = (
    "import sys; sys.modules['boto3'] = sys.modules['botocore'] = None\n"
    "from functions.cli import main\nmain()"
)


def moto_schedule(output: Output) -> dict[str, Any]:
    """The wake schedule in the moto this `duly dev` announced."""
    found = MOTO.search(output.text)
    assert found, output.text
    client = boto3.session.Session().client(
        "scheduler",
        endpoint_url=found.group(1),
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    schedule: dict[str, Any] = client.get_schedule(Name=SCHEDULE, GroupName=GROUP)
    return schedule


def expression(stamp: str) -> str:
    """The `at()` expression of a logged 'next at' instant."""
    return f"at({stamp.replace(' ', 'T')})"


def wait_line(pattern: str, output: Output, what: str) -> re.Match[str]:
    """The first output line matching `pattern`, waited for."""
    compiled = re.compile(pattern)
    wait_for(lambda: compiled.search(output.text), SETTLE, what, output)
    found = compiled.search(output.text)
    assert found is not None
    return found


def test_serverless_dev_runs_steps_in_wake_invocations_and_fires_the_schedule(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "pgdata"
    port = free_port()
    args = ("dev", "--serverless", "--no-demo", "--port", str(port))
    base_url = f"http://127.0.0.1:{port}"
    with (
        duly_process(*args, cwd=REPO_ROOT, env=dev_env(data_dir)) as (process, output),
        httpx.Client(base_url=base_url, trust_env=False, timeout=5) as client,
    ):
        wait_healthy(process, output, client)
        assert "serverless mode: no worker in this process" in output.text
        # The first wake, for runs started before: there are none.
        wait_line(r"wake \(start\): 0 steps, caught up, nothing scheduled", output, "first wake")

        row = {"user_id": "ada", "email": "ada@example.com"}
        started = client.post("/workflows/onboarding/start", json={"row": row, "step": "welcome"})
        assert started.status_code == 201, started.text
        key = started.json()["key"]
        kicked = wait_line(rf"wake \(kick\): 1 step, caught up, next at {STAMP}", output, "kick")
        welcome = output.text.index(f"onboarding[{key}] welcome ok")
        assert welcome < kicked.start(), "the welcome step ran outside the wake invocation"
        assert "send_email('ada@example.com', 'welcome')" in output.text

        # welcome returned wake_in(check, 3 days): one schedule at that instant, in moto.
        schedule = moto_schedule(output)
        assert schedule["ScheduleExpression"] == expression(kicked.group(1))
        assert json.loads(schedule["Target"]["Input"]) == {"duly": "wake"}
        at = parse_at(schedule["ScheduleExpression"], schedule["ScheduleExpressionTimezone"])
        assert at is not None
        assert abs(at - (datetime.now(UTC) + timedelta(days=3))) < timedelta(minutes=1)

        moved = client.post("/dev/clock", json={"days": 3})
        assert moved.status_code == 200, moved.text
        fired = wait_line(
            rf"wake \(schedule at {re.escape(kicked.group(1))} UTC\): 1 step, caught up, "
            rf"next at {STAMP}",
            output,
            "the schedule fired",
        )
        assert f"onboarding[{key}] check ok" in output.text[: fired.start()]
        run = client.get(f"/workflows/onboarding/runs/{key}").json()
        assert (run["row"]["nudges"], run["state"]) == (1, "scheduled"), run
        # check returned wake_in(check, 4 days): the schedule moved, on the database clock.
        moved_to = moto_schedule(output)["ScheduleExpression"]
        assert moved_to == expression(fired.group(1))
        moved_at = parse_at(moved_to, "UTC")
        assert moved_at is not None
        assert abs(moved_at - (datetime.now(UTC) + timedelta(days=7))) < timedelta(minutes=1)
        # Fired once: the registration that fired is not fired again while it stands.
        time.sleep(3 * POLL_SECONDS)
        assert len(re.findall(r"wake \(schedule at ", output.text)) == 1, output.text
        postmaster = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])

        process.send_signal(signal.SIGINT)
        assert process.wait(EXIT_TIMEOUT) == 0, output.join()
    text = output.join()
    assert "Traceback" not in text, text
    assert process_gone(postmaster), "the embedded PostgreSQL outlived duly dev"

    # A fresh moto knows nothing of the last session's schedule: the first wake registers
    # the run's next instant again (the database row was told to forget it).
    with duly_process(*args, cwd=REPO_ROOT, env=dev_env(data_dir)) as (process, output):
        again = wait_line(rf"wake \(start\): 0 steps, caught up, next at {STAMP}", output, "wake")
        assert again.group(1) == fired.group(1)
        assert moto_schedule(output)["ScheduleExpression"] == expression(fired.group(1))
        process.send_signal(signal.SIGINT)
        assert process.wait(EXIT_TIMEOUT) == 0, output.join()


def test_serverless_without_moto_says_what_to_install(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_MOTO, "dev", "--serverless"],
        cwd=tmp_path,
        env=dev_env(tmp_path / "pgdata"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "duly: duly dev --serverless needs boto3 and moto's server, which duly's dev extra "
        "installs (moto is missing): pip install 'duly[dev]' (or pip install 'duly[aws]' "
        "'moto[server]').\n"
    )
    assert not (tmp_path / "pgdata").exists(), "PostgreSQL was started before refusing"


def test_serverless_without_boto3_says_what_to_install(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_BOTO3, "dev", "--serverless"],
        cwd=tmp_path,
        env=dev_env(tmp_path / "pgdata"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == (
        "duly: duly dev --serverless needs boto3 and moto's server, which duly's dev extra "
        "installs (boto3 is missing): pip install 'duly[dev]' (or pip install 'duly[aws]' "
        "'moto[server]').\n"
    )
    assert not (tmp_path / "pgdata").exists(), "PostgreSQL was started before refusing"


def test_the_firer_reads_at_expressions_and_says_what_a_wake_did() -> None:
    assert parse_at("at(2026-03-29T01:30:00)", "Europe/Paris") == datetime(
        2026, 3, 29, 0, 30, tzinfo=UTC
    )
    assert parse_at("rate(5 minutes)", "UTC") is None
    result = {"steps": 0, "caught_up": False, "slot": None, "invoked": 1, "reason": "busy"}
    assert describe_result(result, None) == "0 steps, not caught up, busy, invoked 1 more, " + (
        "nothing scheduled"
    )
    context = LocalContext(60.0)
    assert 59_000 < context.get_remaining_time_in_millis() <= 60_000


# Seconds an idle `duly dev --serverless` must query nothing (before it rested: 34 commits in 10 s).
IDLE_WINDOW = 12.0
COUNTERS = "SELECT xact_commit, sessions FROM pg_stat_database WHERE datname = current_database()"
OTHER_CLIENTS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)
STATS_SETTLE = 1.0  # seconds for a closed backend's counts to reach pg_stat_database
FIRE_GRACE = 2.0  # seconds a due schedule may take to fire and its step to log, on a busy machine


@pytest.mark.processes
def test_serverless_dev_reads_no_database_while_nothing_is_due_and_fires_on_time(
    tmp_path: Path,
) -> None:
    port = free_port()
    args = ("dev", "--serverless", "--no-demo", "--port", str(port))
    with (
        duly_process(*args, cwd=REPO_ROOT, env=dev_env(tmp_path / "pgdata")) as (process, output),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5) as client,
    ):
        wait_healthy(process, output, client)
        wait_line(r"wake \(start\): 0 steps", output, "first wake")
        url = wait_line(r"database: (\S+)", output, "the database URL").group(1)
        row = {"user_id": "ada", "email": "ada@example.com"}
        started = client.post("/workflows/onboarding/start", json={"row": row, "step": "welcome"})
        assert started.status_code == 201, started.text
        kicked = wait_line(rf"wake \(kick\): 1 step, caught up, next at {STAMP}", output, "kick")

        # The run waits three days: nothing is due, so nothing may read the database. The
        # cluster is this test's own: autovacuum, its only other client, is stopped so the
        # commits counted are duly's. The admin's own commits are counted when it exits.
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET autovacuum = off")
            admin.execute("SELECT pg_reload_conf()")
            assert admin.execute(OTHER_CLIENTS).fetchone() == (0,), "a connection is held"
        time.sleep(STATS_SETTLE)
        with psycopg.connect(url, autocommit=True) as watcher:
            before = watcher.execute(COUNTERS).fetchone()
            time.sleep(IDLE_WINDOW)
            after = watcher.execute(COUNTERS).fetchone()
            assert watcher.execute(OTHER_CLIENTS).fetchone() == (0,), "a connection is held"
        assert before is not None and after is not None
        # One commit is the watcher's own first read; no session was opened but the watcher's.
        assert (after[0] - before[0] - 1, after[1] - before[1]) == (0, 0), output.text

        # Move the clock to three seconds before the schedule's instant: the firer reads the
        # clock once, then fires on the schedule's own time, not before.
        at = datetime.fromisoformat(kicked.group(1)).replace(tzinfo=UTC)
        early = (at - datetime.now(UTC)).total_seconds() - 3
        moved = client.post("/dev/clock", json={"seconds": early})
        assert moved.status_code == 200, moved.text
        due = (at - timedelta(seconds=moved.json()["shift_seconds"])).timestamp()
        check = f"onboarding[{started.json()['key']}] check ok"
        time.sleep(max(0.0, due - time.time() - 0.3))
        assert check not in output.text, "the schedule fired before its instant"
        wait_for(lambda: check in output.text, due - time.time() + FIRE_GRACE, "check", output)
        assert time.time() >= due
        wait_line(rf"wake \(schedule at {re.escape(kicked.group(1))} UTC\): 1 step", output, "fire")
        process.send_signal(signal.SIGINT)
        assert process.wait(EXIT_TIMEOUT) == 0, output.join()
    assert "Traceback" not in output.join()
