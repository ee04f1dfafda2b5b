"""The pressure bench's printed table: one column per phase, then every table and index.

The JSON carries the same figures and more (slices, WAL counters, what each
pressure did); this is what a person reads first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Row = tuple[str, Callable[[dict[str, Any]], str]]


def number(value: object, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, int | float):
        return f"{value:,.{digits}f}"
    return str(value)


def yes(value: object) -> str:
    return "yes" if value else "no"


def drained(drain: dict[str, Any]) -> str:
    return number(drain.get("seconds"), 1) if drain["drained"] else "not drained"


def last_over_first(slices: list[dict[str, Any]]) -> float | None:
    """The claim's mean time in the phase's last tenth over its first: flat is about 1."""
    means = [s["mean_ms"] for s in slices if s["mean_ms"] is not None]
    return means[-1] / means[0] if len(means) > 1 and means[0] else None


ROWS: list[Row] = [
    ("started on a backlog", lambda p: yes(p["started_on_backlog"])),
    ("backlog at start", lambda p: number(p["backlog_at_start"])),
    ("seconds", lambda p: number(p["seconds"], 1)),
    ("offered/s (target)", lambda p: number(p["offered_rate"])),
    ("offered/s (measured)", lambda p: number(p["offered_per_s"])),
    ("producer batches/s", lambda p: number(p["batches_per_s"])),
    ("completed/s", lambda p: number(p["completed_per_s"])),
    ("completed / capacity", lambda p: number(p["completed_of_capacity"], 2)),
    ("pickup p50 ms", lambda p: number(p["pickup_p50_ms"], 1)),
    ("pickup p99 ms", lambda p: number(p["pickup_p99_ms"], 1)),
    ("pickup max ms", lambda p: number(p["pickup_max_ms"], 1)),
    ("claim mean ms", lambda p: number(p["claims"]["mean_ms"], 2)),
    ("claim rows/call", lambda p: number(p["claims"]["rows_per_call"], 1)),
    ("claim ms last/first 10th", lambda p: number(last_over_first(p["claim_slices"]), 2)),
    ("backlog at end", lambda p: number(p["backlog_at_end"])),
    ("WAL bytes/step", lambda p: number(p["wal_bytes_per_step"])),
    ("WAL syncs/step", lambda p: number(p["wal_syncs_per_step"], 3)),
    ("WAL writes/step", lambda p: number(p["wal_writes_per_step"], 3)),
    ("drained after s", lambda p: drained(p["drain"])),
    ("drain completed/s", lambda p: number(p["drain"].get("completed_per_s"))),
    ("drain / capacity", lambda p: number(p["drain"].get("of_capacity"), 2)),
    ("recovered after s", lambda p: number(p["recovery"]["recovered_after_s"], 1)),
    ("runs", lambda p: number(p["invariants"]["runs"])),
    ("still queued", lambda p: number(p["invariants"]["still_queued"])),
    ("lost", lambda p: number(p["invariants"]["lost"])),
    ("ran twice", lambda p: number(p["invariants"]["ran_twice"])),
    ("failed attempts", lambda p: number(p["invariants"]["failed_attempts"])),
]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell: the first left-aligned, the others right."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first, *rest = cells
        padded = [first.ljust(widths[0])]
        padded += [cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True)]
        return "  ".join(padded)

    return [line(header), *(line(row) for row in rows)]


KEEP_UP = 0.95  # completions at least this share of the measured offer
HELD_P99_MS = 100.0  # pickup p99 while xmin is held
RECOVERY_S = 60.0  # back within 20% of the clean p99 after the release
NEAR_CAPACITY = 0.9  # overload completions, and the drain after it, at least this share
CLAIM_FLAT = 1.5  # the claim's mean time at the overload's end, at most this times its start


def aim(value: float | None, holds: bool, wanted: str) -> dict[str, Any]:
    return {"value": value, "aim": wanted, "holds": value is not None and holds}


def aims(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The held-xmin and overload phases' figures against what they should reach."""
    by_name = {phase["phase"]: phase for phase in report["phases"]}
    found: dict[str, dict[str, Any]] = {}
    held = by_name.get("held_xmin")
    if held is not None:
        share = (held["completed_per_s"] / held["offered_per_s"]) if held["offered_per_s"] else None
        p99, back = held["pickup_p99_ms"], held["recovery"]["recovered_after_s"]
        found["held_xmin_keeps_up"] = aim(share, (share or 0) >= KEEP_UP, f">= {KEEP_UP}")
        found["held_xmin_p99_ms"] = aim(p99, (p99 or 0) <= HELD_P99_MS, f"<= {HELD_P99_MS}")
        found["held_xmin_recovered_s"] = aim(back, (back or 0) <= RECOVERY_S, f"<= {RECOVERY_S}")
    over = by_name.get("overload")
    if over is not None:
        share = over["completed_of_capacity"]
        found["overload_completed_of_capacity"] = aim(
            share, share >= NEAR_CAPACITY, f">= {NEAR_CAPACITY}"
        )
        drain = over["drain"].get("of_capacity") if over["drain"]["drained"] else None
        found["overload_drain_of_capacity"] = aim(
            drain, (drain or 0) >= NEAR_CAPACITY, f">= {NEAR_CAPACITY}"
        )
        flat = last_over_first(over["claim_slices"])
        found["overload_claim_last_over_first"] = aim(
            flat, (flat or CLAIM_FLAT + 1) <= CLAIM_FLAT, f"<= {CLAIM_FLAT}"
        )
    return found


def format_report(report: dict[str, Any]) -> str:
    phases = report["phases"]
    names = [p["phase"] for p in phases]
    lines = [
        f"capacity: {report['capacity_steps_per_s']:,.0f} no-op steps/s of "
        f"{report['settings']['workers']} worker processes "
        f"(load before {report['load_before']}, after {report['load_after']})",
        "",
        *table(["figure", *names], [[label, *(get(p) for p in phases)] for label, get in ROWS]),
        "",
        "dead tuples / size (kB) at each phase's end:",
    ]
    relations = sorted({name for p in phases for name in p["tables"]})
    rows = []
    for name in relations:
        cells = []
        for p in phases:
            rel = p["tables"].get(name)
            if rel is None:
                cells.append("—")
            elif rel["kind"] == "table":
                cells.append(f"{rel['dead_tuples']:,} / {rel['bytes'] // 1024:,}")
            else:
                cells.append(f"{rel['bytes'] // 1024:,}")
        rows.append([name, *cells])
    lines += table(["table or index", *names], rows)
    lines += ["", "aims:"]
    for name, found in report["aims"].items():
        verdict = "holds" if found["holds"] else "does not hold"
        lines.append(f"  {name}: {number(found['value'], 3)} (aim {found['aim']}): {verdict}")
    final = report["final_drain"]
    lines += [
        "",
        f"phases run: {', '.join(report['phases_run'])}; the claim's cost "
        + ("from pg_stat_statements" if report["claims_measured"] else "not measured"),
        f"at the end, producer stopped: {drained(final)} "
        f"({number(final['backlog'])} unfinished, {number(final['left'])} left)",
        f"worker processes that exited before the end: {report['workers_exited_early']}; "
        f"producer batches refused (retried): {report['producer_failed_batches']}",
        f"still queued (not lost): {report['still_queued']:,}",
        f"violations (lost + ran twice, every phase): {report['violations']}",
    ]
    return "\n".join(lines)
