"""How the commands find their database and their app when nothing names them.

Run from a folder where `duly dev` runs, a command takes that database (and
says so); DULY_APP unset is said to mean duly's examples; a DULY_APP that maps
no workflow is refused instead of printing empty tables; a command stopped by Ctrl-C
says what stays done and exits 130, never a traceback.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.views.overview import RUN_STATES
from functions.cli.common import run_until_interrupted
from functions.command_line import INTERRUPTED
from tests.conftest import Database
from tests.helpers import EXIT_TIMEOUT, dev_env, duly_process, free_port, run_duly, wait_healthy

EXAMPLES_NOTICE = (
    "duly: DULY_APP is not set: using duly's examples (functions.examples); set DULY_APP to "
    "the module that maps your workflows (DULY_APP=myapp.workflows).\n"
)
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing"  # never connected to: refused before


def here_env(folder: Path, **settings: str) -> dict[str, str]:
    """No DULY_* setting at all: the data dir is the folder's own `.duly/pgdata`."""
    env = dev_env(folder / "unused", **settings)
    del env["DULY_DATA_DIR"]
    return env


def test_a_command_run_where_duly_dev_runs_takes_its_database(tmp_path: Path) -> None:
    env = here_env(tmp_path)
    port = free_port()
    with duly_process("dev", "--port", str(port), cwd=tmp_path, env=env) as (process, output):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            wait_healthy(process, output, client)
        data_dir = (tmp_path / ".duly" / "pgdata").resolve()
        printed = run_duly("db-url", cwd=tmp_path, env=env)
        assert printed.returncode == 0, printed.stderr
        dev_url = printed.stdout.strip()

        status = run_duly("status", cwd=tmp_path, env=env)
        assert status.returncode == 0, status.stderr
        assert status.stderr == (
            f"duly: using the database of the duly dev running in {data_dir}: {dev_url}\n"
            + EXAMPLES_NOTICE
        )
        [onboarding] = [line for line in status.stdout.splitlines() if line.startswith("onboard")]
        states = onboarding.split()[2 : 2 + len(RUN_STATES)]
        assert sum(map(int, states)) == 1, status.stdout  # the demo run duly dev started

        unknown = run_duly("runs", "refund", cwd=tmp_path, env=env)
        assert unknown.returncode == 1, unknown.stderr
        assert unknown.stderr.count(EXAMPLES_NOTICE) == 1
        assert unknown.stderr.endswith(
            "duly: No workflow named 'refund'. This app maps: digest, "
            "duly_graph_timers, duly_outbox, expense, lookup, onboarding, research.\n"
        )

        named = run_duly("status", "--database-url", UNREACHABLE, cwd=tmp_path, env=env)
        assert named.returncode == 1, named.stderr  # the database named wins over duly dev's
        assert named.stderr.startswith(EXAMPLES_NOTICE + "duly: the database refused")

        # duly dev makes its tables without revisions: migrate does not take its database.
        migrate = run_duly("migrate", cwd=tmp_path, env=env)
        assert (migrate.returncode, migrate.stdout) == (2, "")
        assert migrate.stderr == (
            f"duly: duly migrate needs a database of its own: the duly dev running in {data_dir} "
            "creates its tables without revisions, so migrating it would find them there "
            "already. Pass --database-url or set DULY_DATABASE_URL.\n"
        )
        process.send_signal(signal.SIGINT)
        assert process.wait(EXIT_TIMEOUT) == 0, output.join()

    stopped = run_duly("status", cwd=tmp_path, env=env)
    assert (stopped.returncode, stopped.stdout) == (2, "")
    assert stopped.stderr == (
        "duly: duly status needs the workflow database: pass --database-url or set "
        f"DULY_DATABASE_URL, or start duly dev in this folder (none runs in {data_dir}; it is "
        "found by itself).\n"
    )


@pytest.mark.parametrize(
    "command",
    [("status",), ("runs", "invoice"), ("show", "invoice", "1"), ("prune",), ("drain",)],
)
def test_an_app_that_maps_no_workflow_is_refused_by_name(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("import json\n")
    env = here_env(tmp_path, DULY_APP="myapp")
    result = run_duly(*command, "--database-url", UNREACHABLE, cwd=tmp_path, env=env)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == (
        "duly: myapp maps no workflow: point DULY_APP at the module that defines or imports "
        "your Workflow classes.\n"
    )


def test_a_command_stopped_by_ctrl_c_says_what_stays_done(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    batches: list[int] = []

    async def interrupted_after_a_batch(Session: async_sessionmaker[AsyncSession]) -> int:
        async with Session() as session:
            batches.append((await session.execute(text("SELECT 1"))).scalar_one())
        raise KeyboardInterrupt  # as Ctrl-C does, between two batches

    said = "duly bulk: interrupted; every batch already committed stays done."
    status = run_until_interrupted(db.url, interrupted_after_a_batch, interrupted=said)
    assert (status, batches) == (INTERRUPTED, [1])
    assert capsys.readouterr().err == f"\n{said}\n"
