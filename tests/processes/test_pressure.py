"""The pressure bench, short: every phase reports every figure, and no run is lost or run twice.

`python bench/pressure.py` with phases of 3 s at a fifth of the capacity, a
small capacity backlog, 50 idle connections and a 5 s lease (so a run whose
worker's connection was terminated mid-claim comes back within the test).
The long version is `python bench/pressure.py --phase-seconds 300`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.pressure import PHASES

REPO_ROOT = Path(__file__).resolve().parents[2]
SHORT = [
    "--phase-seconds", "3",
    "--fraction", "0.2",
    "--capacity-runs", "1000",
    "--idle-connections", "50",
    "--recovery-seconds", "3",
    "--lease", "5",
]  # fmt: skip
PHASE_FIGURES = {
    "seconds",
    "offered_rate",
    "offered",
    "offered_per_s",
    "completed_per_s",
    "pickup_p50_ms",
    "pickup_p99_ms",
    "wal_bytes_per_step",
    "wal_syncs_per_step",
    "backlog_at_end",
    "recovery",
    "tables",
    "invariants",
}
DULY_TABLES = {"pressure_probe", "pressure_attempts", "pressure_probe_pkey"}  # among others


@pytest.mark.timeout(150)
def test_every_phase_reports_its_figures_and_loses_or_repeats_no_run(tmp_path: Path) -> None:
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
    assert [phase["phase"] for phase in report["phases"]] == list(PHASES)
    for phase in report["phases"]:
        name = phase["phase"]
        assert phase.keys() >= PHASE_FIGURES, (name, PHASE_FIGURES - phase.keys())
        assert phase["completed_per_s"] > 0, name
        assert phase["offered"] > 0 and phase["pickup_p99_ms"] is not None, name
        assert phase["wal_bytes_per_step"] > 0, name
        assert phase["tables"].keys() >= DULY_TABLES, name
        assert "dead_tuples" in phase["tables"]["pressure_probe"], name
        # Every run offered in the phase and its recovery, counted from the database.
        assert phase["invariants"]["runs"] >= phase["offered"], name
        assert phase["invariants"]["lost"] == 0, name
        assert phase["invariants"]["ran_twice"] == 0, name
        if name != "clean":
            assert "recovered_after_s" in phase["recovery"], name
            assert "after_p99_ms_by_second" in phase["recovery"], name
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
    }
    assert report["violations"] == 0
    assert "violations (lost + ran twice, every phase): 0" in finished.stdout
