"""The pressure bench, short: every phase starts on a drained backlog and reports its figures,
no run is lost or run twice, and a run still queued is not counted as lost.

`python bench/pressure.py` with phases of 3 s at a fifth of the capacity, a
small capacity backlog, 50 idle connections, recovery looked for 1 s after
each drain, and a 5 s lease (a run whose worker's connection was terminated
mid-claim comes back within the test); the rule for lost runs on a table of
runs in every state. The long version: `python bench/pressure.py --phase-seconds 300`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from bench.pressure import PHASES, Settings, parse_settings, worker_options
from bench.pressure_app import ATTEMPTS_TABLE, TABLE, Base
from bench.pressure_figures import BACKLOG, invariants
from bench.pressure_processes import Producer
from bench.pressure_producer import TICK
from tests.conftest import Database

REPO_ROOT = Path(__file__).resolve().parents[2]
SHORT = [
    "--phase-seconds", "3",
    "--fraction", "0.2",
    "--capacity-seconds", "2",
    "--idle-connections", "50",
    "--recovery-seconds", "1",
    "--lease", "5",
]  # fmt: skip
PHASE_FIGURES = {
    "seconds",
    "offered_rate",
    "offered",
    "offered_per_s",
    "batches_per_s",
    "completed_per_s",
    "completed_of_capacity",
    "pickup_p50_ms",
    "pickup_p99_ms",
    "wal_bytes_per_step",
    "wal_syncs_per_step",
    "claims",
    "claim_slices",
    "started_on_backlog",
    "backlog_at_start",
    "backlog_at_end",
    "drain",
    "recovery",
    "tables",
    "invariants",
}
DULY_TABLES = {"pressure_probe", "pressure_attempts", "pressure_probe_pkey"}  # among others
BATCHES_PER_S = 1.5 / TICK  # the producer's pace, with room for a slow tick's catching up
PASSED_OVER_S = 300.0  # the runs' due time before which an unfinished one counts as lost


@pytest.mark.timeout(150)
def test_every_phase_starts_drained_reports_its_figures_and_loses_no_run(tmp_path: Path) -> None:
    report_path = tmp_path / "pressure.json"
    finished = subprocess.run(
        [sys.executable, "bench/pressure.py", *SHORT, "--json", str(report_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=140,
    )
    print(finished.stdout, finished.stderr[-3000:])
    assert finished.returncode == 0, finished.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["capacity_steps_per_s"] > 0
    assert report["capacity_invariants"]["runs"] > 0  # the pipeline kept full, all finished
    assert report["capacity_invariants"]["lost"] == report["capacity_invariants"]["ran_twice"] == 0
    assert report["phases_run"] == [phase["phase"] for phase in report["phases"]] == list(PHASES)
    assert report["claims_measured"], "pg_stat_statements is loaded on the embedded server"
    previous: dict[str, object] | None = None
    for phase in report["phases"]:
        name = phase["phase"]
        assert phase.keys() >= PHASE_FIGURES, (name, PHASE_FIGURES - phase.keys())
        assert phase["completed_per_s"] > 0, name
        assert phase["offered"] > 0 and phase["pickup_p99_ms"] is not None, name
        assert phase["wal_bytes_per_step"] > 0, name
        if name != "overload":  # offers it keeps up with: a tick's worth a batch, not a stream
            assert phase["batches_per_s"] <= BATCHES_PER_S, name
        assert phase["claims"]["calls"] > 0 and phase["claims"]["mean_ms"] > 0, name
        assert len(phase["claim_slices"]) == 10, name
        assert phase["tables"].keys() >= DULY_TABLES, name
        assert "dead_tuples" in phase["tables"]["pressure_probe"], name
        # The last phase's backlog was drained before this one began, and it says so.
        assert phase["drain"]["drained"], name
        assert phase["started_on_backlog"] is False, name
        if previous is not None:
            assert previous["drain"]["drained"], name  # type: ignore[index]
        if phase["drain"]["seconds"] > 0:
            assert phase["drain"]["completed_per_s"] > 0, name
        # Every run offered in the phase and its recovery, counted from the database.
        assert phase["invariants"]["runs"] >= phase["offered"], name
        assert phase["invariants"]["lost"] == 0, name
        assert phase["invariants"]["still_queued"] == 0, name  # the end drained everything
        assert phase["invariants"]["ran_twice"] == 0, name
        if name != "clean":
            assert "recovered_after_s" in phase["recovery"], name
            assert "after_p99_ms_by_second" in phase["recovery"], name
        previous = phase
    pressures = {phase["phase"]: phase["pressure"] for phase in report["phases"]}
    assert pressures["held_xmin"]["held_xid"] > 0
    assert pressures["readers"]["scans"] > 0
    assert pressures["terminate"]["terminated"] > 0
    assert pressures["idle_connections"]["idle_connections"] == 50
    assert report["aims"].keys() == {
        "held_xmin_keeps_up",
        "held_xmin_p99_ms",
        "held_xmin_recovered_s",
        "overload_completed_of_capacity",
        "overload_drain_of_capacity",
        "overload_claim_last_over_first",
    }
    assert report["final_drain"]["drained"] and report["final_drain"]["left"] == 0
    assert report["violations"] == 0 and report["still_queued"] == 0
    assert "violations (lost + ran twice, every phase): 0" in finished.stdout


def test_only_runs_the_phases_named_after_the_clean_one() -> None:
    settings, _ = parse_settings(["--only", "overload,held_xmin", "--phase-seconds", "300"])
    assert settings.phases == ("clean", "held_xmin", "overload")
    assert settings.phase_seconds == 300.0
    with pytest.raises(SystemExit):
        parse_settings(["--only", "clean,vacuum"])


def test_the_command_line_without_options_runs_the_settings_defaults() -> None:
    settings, _ = parse_settings([])
    assert settings == Settings()
    assert settings.capacity_seconds == 60.0 and settings.concurrency == 32
    told, _ = parse_settings(["--concurrency", "8", "--capacity-seconds", "5"])
    assert told.concurrency == 8 and told.capacity_seconds == 5.0
    assert worker_options(told)[-2:] == ["--concurrency", "8"]


@pytest.mark.timeout(60)
async def test_the_producer_filling_keeps_the_unfinished_runs_at_its_target(db: Database) -> None:
    await db.create(Base.metadata)
    producer = Producer(db.url)
    await producer.start()
    try:
        await producer.fill(50, "fill")  # no worker takes them: the table fills to 50, no more
        for _ in range(100):
            if db.sql(BACKLOG)[0][0] >= 50:
                break
            time.sleep(TICK)
        time.sleep(10 * TICK)  # ten more ticks, each topping up to the target
        assert db.sql(BACKLOG)[0][0] == 50
        db.sql(f"UPDATE {TABLE} SET next_step = NULL WHERE id IN (SELECT id FROM {TABLE} LIMIT 20)")
        for _ in range(100):
            if db.sql(f"SELECT count(*) FROM {TABLE}")[0][0] == 70:
                break
            time.sleep(TICK)
        time.sleep(10 * TICK)
        assert db.sql(BACKLOG)[0][0] == 50  # the 20 finished ones were topped up
        assert db.sql(f"SELECT count(*) FROM {TABLE}")[0][0] == 70
        await producer.offer(0.0, "idle")
    finally:
        await producer.finish()
    assert producer.failed_batches == 0


async def test_a_run_still_queued_is_not_lost_and_one_passed_over_is(db: Database) -> None:
    await db.create(Base.metadata)
    now = time.time()
    runs = [  # (next_step, seconds from now it is due, ran, ok rows): what became of it
        (None, None, 1, 1),  # finished
        (None, None, 2, 2),  # ran twice
        (None, None, 0, 0),  # finished without its step: lost
        ("run", 0.0, 0, 0),  # due now: still queued
        ("run", 30.0, 0, 0),  # leased, due at its lease's end: still queued
        ("run", None, 0, 0),  # never due, no claim takes it: lost
        ("run", -2 * PASSED_OVER_S, 0, 0),  # due long before the workers caught up: lost
    ]
    async with await psycopg.AsyncConnection.connect(db.conninfo, autocommit=True) as conn:
        for next_step, due_in, ran, ok_rows in runs:
            cursor = await conn.execute(
                f"INSERT INTO {TABLE} (phase, offered_at, next_step, wake_at, ran) VALUES "
                "('p', %s, %s, to_timestamp(%s), %s) RETURNING id",
                (now, next_step, None if due_in is None else now + due_in, ran),
            )
            row = await cursor.fetchone()
            assert row is not None
            for attempt in range(ok_rows):
                await conn.execute(
                    f"INSERT INTO {ATTEMPTS_TABLE} (workflow, run_key, step, attempt, outcome, "
                    "took_ms, finished_at) VALUES (%s, %s, 'run', %s, 'ok', 1, now())",
                    (TABLE, str(row[0]), attempt + 1),
                )
        caught_up = await invariants(conn, ["p"], now - PASSED_OVER_S)
        never_caught_up = await invariants(conn, ["p"], None)
    assert caught_up == {
        "runs": 7,
        "lost": 3,
        "finished_unrun": 1,
        "never_due": 1,
        "passed_over": 1,
        "still_queued": 2,
        "ran_twice": 1,
        "failed_attempts": 0,
    }
    # Without a moment the workers caught up, an old due run is still queued, not lost.
    assert never_caught_up["passed_over"] == 0
    assert never_caught_up["still_queued"] == 3 and never_caught_up["lost"] == 2
