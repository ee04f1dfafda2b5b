"""duly's benchmark: what one worker process does per second, and how soon and how late it runs.

    python bench/run.py [--quick] [--json PATH] [--only noop,latency,idle] [--pool-size N]
                        [--statement-log DIR | --profile DIR]

It starts its own embedded PostgreSQL (fsync on: every figure pays for real commits) and
takes each measurement in a fresh database: steps, chains, events, deliveries and fan-outs
a second, latency and lateness, an idle worker's queries, the Lambda entries' cold imports
and wakes, claims, prunes and console pages. bench/README.md says how each is taken. The
table goes to stdout, then the same figures as JSON. A measurement that fails is reported
as failed, the others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # Run as a script, Python puts bench/ on the path, not the repo root.
    sys.path.insert(0, str(REPO_ROOT))

from bench import measures  # noqa: E402
from bench.claims import CLAIM_SIZE, measure_claim_cost  # noqa: E402
from bench.console import (  # noqa: E402
    TARGET_MS as CONSOLE_TARGET_MS,
    measure_console,
)
from bench.graphs import measure_transitions  # noqa: E402
from bench.harness import WORKER_CONCURRENCY, BenchDatabase  # noqa: E402
from bench.lambdas import (  # noqa: E402
    CLAIMED_ENTRIES,
    DIRECT_WITHIN,
    ENTRIES,
    measure_cold_imports,
    measure_first_wake,
    measure_lambda_wake,
    measure_scheduler_calls,
)
from bench.load import (  # noqa: E402
    measure_lateness_under_load,
    measure_memory,
    measure_scaling,
)
from bench.models import Chain, NoOp, Publisher  # noqa: E402
from bench.one_client import measure_deliver_beside_start  # noqa: E402
from bench.outbox import measure_outbox, measure_publish_cost  # noqa: E402
from bench.pgqueuer_peer import measure_pgqueuer, pgqueuer_version  # noqa: E402
from bench.prune import BASELINE_SECONDS, measure_prune  # noqa: E402
from bench.report import Report, format_table, machine_info  # noqa: E402
from bench.search import (  # noqa: E402
    TARGET_MS as SEARCH_TARGET_MS,
    measure_search,
)
from bench.server_cost import beside_cost, cost_lines  # noqa: E402
from bench.starts import (  # noqa: E402
    BATCH as START_BATCH,
    measure_batch_starts,
)
from engine import EventSettings  # noqa: E402
from infra.embedded import EmbeddedPostgres, start_embedded  # noqa: E402

SCALING_PROCESSES = (1, 2, 4)
REFERENCE_CLIENTS = (1, 8)  # UPDATE clients, each on a row of its own
MEASUREMENTS = (
    "reference",
    "noop",
    "effects",
    "pgqueuer",
    "scaling",
    "memory",
    "outbox",
    "publish",
    "chain",
    "latency",
    "timer",
    "timerload",
    "deliver",
    "starts",
    "fanout",
    "idle",
    "claims",
    "coldstart",
    "lambdawake",
    "schedulercalls",
    "graphs",
    "prune",
    "console",
    "search",
)

# The peers' figures, from /work/shared/TOOLCHAIN.md (same kind of machine, PostgreSQL 15).
PEER_UPDATES = {1: "pgbench, PG 15: 4,850/s", 8: "pgbench, PG 15: 10,400/s"}
PEER_JOBS = "pgqueuer: the next line, same run; procrastinate ~300 (TOOLCHAIN.md)"
PEER_CHAINS = "pgqueuer ~370-420 (its jobs/s / 3)"
PEER_LATENCY = "pgqueuer, procrastinate: 1-3 ms"
PEER_LATENESS = "pgqueuer ~140 ms; procrastinate ~3.3 s"
NO_PEER = "—"  # the peers have no wait-for-event, fan-out or wake() to compare with
# The outbox worker's max_concurrency: the outbox batch size (rows a drain claims),
# then the no-op line's, so the two figures compare like for like.
OUTBOX_CONCURRENCY = (EventSettings().outbox_batch_size, WORKER_CONCURRENCY)


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does; --quick shrinks every one about fivefold."""

    update_seconds: float
    noop_runs: int
    scaling_runs: int  # drained by each count of worker processes
    memory_first: int  # steps before the first reading of a worker's memory
    memory_total: int  # and before the second
    outbox_events: int
    publish_transactions: int  # timed transactions of each kind
    publish_warmup: int  # and left out before them
    chain_runs: int
    latency_runs: int
    timer_runs: int
    deliver_runs: int
    start_runs: int  # started one at a time, and as many again with start_many
    fanout_children: int
    idle_window_seconds: float
    idle_wakes: int
    claim_backlogs: tuple[int, ...]  # waiting rows behind each claim-cost case
    claim_groups: tuple[int, ...]  # tenants they are spread over
    claims: int  # timed claims per case
    cold_processes: int  # fresh processes timed per import kind
    first_wake_processes: int  # fresh processes timed through their first wake
    lambda_wakes: int  # timed warm wake invocations with nothing due
    lambda_wake_warmup: int  # and left out before them
    scheduler_runs: int  # wake_in runs the scheduler calls are counted over
    prune_old_rows: int  # attempt-log rows past the retention period, which duly prune deletes
    prune_new_rows: int  # and rows within it, which it keeps
    console_runs: int  # runs in the table the console's pages are fetched over
    console_fetches: int  # timed fetches of each page
    search_runs: int  # runs in the table the searches read
    search_fetches: int  # timed first pages of each search


FULL = Sizes(
    update_seconds=3.0,
    noop_runs=5000,
    scaling_runs=20_000,
    memory_first=10_000,
    memory_total=100_000,
    outbox_events=5000,
    publish_transactions=500,
    publish_warmup=50,
    chain_runs=2000,
    latency_runs=300,
    timer_runs=300,
    deliver_runs=2000,
    start_runs=10_000,
    fanout_children=1000,
    idle_window_seconds=12.0,
    idle_wakes=50,
    claim_backlogs=(10_000, 1_000_000),
    claim_groups=(100, 10_000),
    claims=200,
    cold_processes=9,
    first_wake_processes=3,
    lambda_wakes=50,
    lambda_wake_warmup=5,
    scheduler_runs=1000,
    prune_old_rows=1_000_000,
    prune_new_rows=100_000,
    console_runs=100_000,
    console_fetches=40,
    search_runs=1_000_000,
    search_fetches=40,
)
QUICK = Sizes(
    update_seconds=0.6,
    noop_runs=1000,
    scaling_runs=4000,
    memory_first=2000,
    memory_total=20_000,
    outbox_events=1000,
    publish_transactions=100,
    publish_warmup=10,
    chain_runs=400,
    latency_runs=60,
    timer_runs=60,
    deliver_runs=400,
    start_runs=2000,
    fanout_children=200,
    idle_window_seconds=3.0,
    idle_wakes=10,
    claim_backlogs=(10_000, 100_000),
    claim_groups=(100,),
    claims=50,
    cold_processes=3,
    first_wake_processes=1,
    lambda_wakes=10,
    lambda_wake_warmup=2,
    scheduler_runs=200,
    prune_old_rows=100_000,
    prune_new_rows=10_000,
    console_runs=20_000,
    console_fetches=10,
    search_runs=200_000,
    search_fetches=10,
)


async def run_all(
    server: EmbeddedPostgres,
    sizes: Sizes,
    only: set[str],
    pool_size: int | None,
    progress: Callable[[str], None],
    diagnostics: Path | None = None,
    profile: bool = False,
) -> Report:
    """Every chosen measurement in turn, each on a fresh database."""
    report = Report(await machine_info(server, WORKER_CONCURRENCY), asdict(sizes))
    report.details["worker_pool_size"] = pool_size or "SQLAlchemy default (5 + 10 overflow)"
    # Before the latency and timer runs; the warm-up fan-out has as many children.
    report.details["warmup_runs"] = measures.WARMUP_RUNS
    ceiling = ""
    noop_rate: float | None = None  # the outbox's figures are read beside it

    async def attempt(name: str, description: str, measure: Awaitable[None]) -> None:
        # One broken measurement (a stuck engine, say) must not cost the others.
        try:
            await measure
        except Exception as exc:
            report.errors[name] = f"{type(exc).__name__}: {exc}"
            report.add(f"{name}_failed", f"{name} ({description})", None, "")
            progress(f"{name} failed: {report.errors[name]}")

    async def reference() -> None:
        nonlocal ceiling
        found = await measures.measure_reference(server, REFERENCE_CLIENTS, sizes.update_seconds)
        report.details["update_commits_per_s"] = found
        for client in ("psycopg", "pgbench"):
            for n, rate in found[client].items():
                clients = f"{n} client{'s' if n > 1 else ''}"
                report.add(
                    f"update_commits_per_s_{n}_{client}",
                    f"UPDATE commits/s, {clients} ({client})",
                    rate,
                    "commits/s",
                    PEER_UPDATES[n],
                )
        for n in REFERENCE_CLIENTS:
            cost = found["cost"]["pgbench"][n]
            clients = f"{n} client{'s' if n > 1 else ''}"
            for line in cost_lines(f"update_{n}_pgbench", f"UPDATE, {clients} (pgbench)", cost,
                                   "commit"):  # fmt: skip
                report.add(*line, NO_PEER)
        # What one commit per step would allow here; batched commits may pass it.
        most = max(REFERENCE_CLIENTS)
        rates = [f"{found[c][most]:,.0f} {c}" for c in ("psycopg", "pgbench") if found[c][most]]
        ceiling = f"; {most}-client UPDATE/s here: {', '.join(rates)}" if rates else ""

    async def noop() -> None:
        found = await measures.measure_throughput(server, NoOp, "run", sizes.noop_runs, pool_size)
        report.details["noop"] = found
        nonlocal noop_rate
        noop_rate = found["runs_per_s"]
        report.add(
            "noop_steps_per_s", "No-op steps/s", found["runs_per_s"], "steps/s", PEER_JOBS + ceiling
        )

    async def effects() -> None:
        found = await measures.measure_throughput(
            server, Publisher, "run", sizes.noop_runs, pool_size
        )
        report.details["effects"] = found
        beside = NO_PEER
        if noop_rate:
            rate = found["runs_per_s"]
            beside = f"no-op steps/s this run: {noop_rate:,.0f} (x{rate / noop_rate:.2f})"
        report.add(
            "publishing_steps_events_per_s",
            "Steps publishing one event each: events committed/s",
            found["runs_per_s"],
            "events/s",
            beside,
        )

    async def pgqueuer() -> None:
        async with BenchDatabase(server, "bench_pgqueuer") as db:
            found = await measure_pgqueuer(db, sizes.noop_runs, WORKER_CONCURRENCY)
        report.details["pgqueuer"] = found
        rate = found["jobs_per_s"]
        beside = f"pgqueuer {pgqueuer_version}, asyncpg, this run"
        if noop_rate:
            beside += f"; duly's no-op steps/s this run: {noop_rate:,.0f} (x{noop_rate / rate:.2f})"
        report.add("pgqueuer_jobs_per_s", "pgqueuer no-op jobs/s (peer)", rate, "jobs/s", beside)

    async def outbox() -> None:
        found: dict[str, Any] = {}
        report.details["outbox"] = found
        for concurrency in OUTBOX_CONCURRENCY:
            case = await measure_outbox(
                server, sizes.outbox_events, concurrency, pool_size, diagnostics, profile
            )
            found[f"max_concurrency_{concurrency}"] = case
            rate = case["events_per_s"]
            beside = NO_PEER
            if noop_rate:
                beside = f"no-op steps/s this run: {noop_rate:,.0f} (x{rate / noop_rate:.2f})"
            report.add(
                f"outbox_events_per_s_{concurrency}",
                f"Outbox events/s (max_concurrency={concurrency})",
                rate,
                "events/s",
                beside,
            )

    async def publish() -> None:
        found = await measure_publish_cost(server, sizes.publish_transactions, sizes.publish_warmup)
        report.details["publish"] = found
        kinds = [
            ("insert_only", "one INSERT", found["business_insert_only_ms"]),
            ("1_event", "INSERT + publish_many(1 event)", found["with_1_event_ms"]),
            ("100_events", "INSERT + publish_many(100 events)", found["with_100_events_ms"]),
        ]
        for key, what, cut in kinds:
            for p in ("p50", "p95"):
                report.add(
                    f"publish_txn_{key}_{p}_ms", f"Transaction, {what}: {p}", cut[p], "ms", NO_PEER
                )
        for label, what in (("1_event", "1 event"), ("100_events", "100 events")):
            added = found[f"added_by_{label}_ms"]
            for p in ("p50", "p95"):
                report.add(
                    f"publish_added_{label}_{p}_ms",
                    f"Publish cost, {what}: added {p}",
                    added[p],
                    "ms",
                    NO_PEER,
                )
        most = max(found["statements_per_publish"].values())
        report.add(
            "publish_statements_per_call",
            "publish_many: statements per call (1 or 100 events)",
            most,
            "statements",
            NO_PEER,
        )

    async def chain() -> None:
        found = await measures.measure_throughput(server, Chain, "a", sizes.chain_runs, pool_size)
        report.details["chain"] = found
        rate = found["runs_per_s"]
        report.add("chain_runs_per_s", "3-step chains/s", rate, "chains/s", PEER_CHAINS)
        report.add(
            "chain_steps_per_s", "3-step chains: steps/s", rate * 3, "steps/s", PEER_JOBS + ceiling
        )

    async def latency() -> None:
        found = measures.percentiles(
            await measures.measure_latency(server, sizes.latency_runs, pool_size)
        )
        report.details["start_to_run_ms"] = found
        for p in ("p50", "p95", "p99"):
            peer = PEER_LATENCY if p == "p50" else ""
            report.add(f"start_to_run_{p}_ms", f"Start-to-run latency {p}", found[p], "ms", peer)

    async def timer() -> None:
        found = measures.percentiles(
            await measures.measure_lateness(server, sizes.timer_runs, pool_size)
        )
        report.details["wake_in_lateness_ms"] = found
        for p in ("p50", "p95", "p99"):
            peer = PEER_LATENESS if p == "p50" else ""
            report.add(f"wake_in_lateness_{p}_ms", f"wake_in lateness {p}", found[p], "ms", peer)

    async def scaling() -> None:
        found: dict[int, Any] = {}
        report.details["scaling"] = found
        updates = report.details.get("update_commits_per_s", {}).get("pgbench", {}).get(8)
        for processes in SCALING_PROCESSES:
            case = await measure_scaling(server, sizes.scaling_runs, processes, pool_size)
            found[processes] = case
            rate = case["steps_per_s"]
            beside = NO_PEER
            if updates:
                beside = (
                    f"8-client pgbench UPDATE/s this run: {updates:,.0f} (x{rate / updates:.2f})"
                )
            plural = "es" if processes > 1 else ""
            report.add(
                f"noop_steps_per_s_{processes}_processes",
                f"No-op steps/s, {processes} worker process{plural}",
                rate,
                "steps/s",
                beside,
            )
            # What the server spent a step, beside a commit of the 8-client UPDATE baseline.
            commit = report.details.get("update_commits_per_s", {}).get("cost", {})
            baseline = commit.get("pgbench", {}).get(8)
            lines = cost_lines(
                f"noop_{processes}_processes",
                f"No-op steps, {processes} worker process{plural}",
                case,
                "step",
            )
            besides = beside_cost(case, baseline, "8-client pgbench UPDATE")
            for line, next_to in zip(lines, besides, strict=True):
                report.add(*line, next_to or NO_PEER)

    async def memory() -> None:
        found = await measure_memory(server, sizes.memory_first, sizes.memory_total, pool_size)
        report.details["memory"] = found
        for when, steps in (("first", sizes.memory_first), ("total", sizes.memory_total)):
            report.add(
                f"worker_rss_mb_after_{steps}",
                f"Worker resident memory after {steps:,} steps",
                found[f"rss_mb_after_{when}"],
                "MiB",
                NO_PEER if when == "first" else f"growth {found['growth']:+.1%} (goal within 10%)",
            )

    async def timerload() -> None:
        found = await measure_lateness_under_load(server, sizes.timer_runs, pool_size)
        lateness = measures.percentiles(found.pop("lateness_ms"))
        report.details["wake_in_lateness_under_load_ms"] = {**lateness, **found}
        for p in ("p50", "p95", "p99"):
            goal = "goal at most 25 ms" if p == "p99" else NO_PEER
            report.add(
                f"wake_in_lateness_under_load_{p}_ms",
                f"wake_in lateness {p}, no-op load in another process",
                lateness[p],
                "ms",
                goal,
            )

    async def deliver() -> None:
        found = await measures.measure_deliveries(server, sizes.deliver_runs, pool_size)
        report.details["deliver"] = found
        tasks = found["delivery_tasks"]
        report.add(
            "deliveries_accepted_per_s",
            f"Deliveries accepted/s ({tasks} tasks)",
            found["accepted_per_s"],
            "deliveries/s",
            NO_PEER,
        )
        report.add(
            "deliveries_applied_per_s",
            "Deliveries: events applied/s",
            found["applied_per_s"],
            "events/s",
            NO_PEER,
        )

        one = await measure_deliver_beside_start(server, sizes.deliver_runs, pool_size)
        report.details["deliver_one_client"] = one
        report.add(
            "deliver_one_client_per_s",
            "deliver() calls/s, one client",
            one["deliver_per_s"],
            "calls/s",
            f"start() from one client, same run: {one['start_per_s']:,.0f}/s "
            f"(deliver x{one['deliver_over_start']:.2f})",
        )

    async def starts() -> None:
        found = await measure_batch_starts(server, sizes.start_runs)
        report.details["starts"] = found
        report.add(
            "batched_starts_per_s",
            f"start_many() runs/s, batches of {START_BATCH}, one client",
            found["batched_per_s"],
            "runs/s",
            f"start() one at a time, same run: {found['one_at_a_time_per_s']:,.0f}/s "
            f"(x{found['batched_over_one']:.1f})",
        )

    async def fanout() -> None:
        found = await measures.measure_fanout(server, sizes.fanout_children, pool_size)
        report.details["fanout"] = found
        report.add(
            "fanout_seconds",
            f"Fan-out of {sizes.fanout_children:,} children: start to then",
            found["seconds"],
            "s",
            NO_PEER,
        )

    async def idle() -> None:
        found = await measures.measure_idle(
            server, sizes.idle_window_seconds, sizes.idle_wakes, pool_size
        )
        report.details["idle"] = found
        for mode in ("listening", "suspends_when_idle"):
            raw = f"{found[mode]['statements']} in {found[mode]['window_s']:g} s"
            report.add(
                f"idle_queries_per_min_{mode}",
                f"Idle worker: queries/min ({mode}; {raw})",
                found[mode]["queries_per_min"],
                "queries/min",
                NO_PEER,
            )
        wake_ms = found["suspends_when_idle"]["wake_ms"]
        for p in ("p50", "p95"):
            report.add(
                f"wake_nothing_due_{p}_ms", f"wake(), nothing due: {p}", wake_ms[p], "ms", NO_PEER
            )

    async def claims() -> None:
        found: dict[str, Any] = {}
        for rows in sizes.claim_backlogs:
            for groups in sizes.claim_groups:
                if groups > rows // 10:
                    continue  # under ten rows a tenant: not a backlog behind a limit
                for limited in (False, True):
                    if not limited and groups != sizes.claim_groups[0]:
                        continue  # without a limit the tenants change nothing
                    case = await measure_claim_cost(server, limited, rows, groups, sizes.claims)
                    cut = measures.percentiles(case.pop("ms"))
                    case["ms"] = cut
                    kind = f"at_most=3 by tenant, {groups:,} tenants" if limited else "no limit"
                    key = f"claim_{rows}_{'limited_' + str(groups) if limited else 'plain'}"
                    found[key] = case
                    report.add(
                        f"{key}_p50_ms",
                        f"Claim of {CLAIM_SIZE}, {rows:,} waiting ({kind}): p50",
                        cut["p50"],
                        "ms",
                        NO_PEER,
                    )
        # The worst case for a limited claim: one tenant's import ahead of all the others.
        rows, groups = sizes.claim_backlogs[-1], sizes.claim_groups[-1]
        big = rows // 10
        case = await measure_claim_cost(server, True, rows, groups, sizes.claims, big_first=big)
        case["ms"] = cut = measures.percentiles(case.pop("ms"))
        key = f"claim_{rows}_limited_{groups}_big_first"
        found[key] = case
        report.add(
            f"{key}_p50_ms",
            f"Claim of {CLAIM_SIZE}, {rows:,} waiting ({groups:,} tenants, "
            f"the oldest {big:,} one tenant's): p50",
            cut["p50"],
            "ms",
            NO_PEER,
        )
        report.add(
            f"{key}_p95_ms",
            f"the same: p95 ({case['visits_of_every_group']} of {sizes.claims} visited every "
            "tenant)",
            cut["p95"],
            "ms",
            NO_PEER,
        )
        plain = found.get(f"claim_{rows}_plain")
        if plain is not None:
            report.add(
                f"{key}_to_plain",
                f"the same: p50 over the claim without a limit's at {rows:,} (goal <= 5)",
                cut["p50"] / plain["ms"]["p50"],
                "x",
                NO_PEER,
            )
        report.details["claims"] = found

    async def coldstart() -> None:
        found = await asyncio.to_thread(measure_cold_imports, sizes.cold_processes)
        report.details["coldstart"] = found
        ms, ratio = found["median_ms"], found["ratio_to_floor"]
        report.add(
            "cold_import_floor_ms",
            "Cold import: sqlalchemy.ext.asyncio + psycopg (the floor)",
            ms["floor"],
            "ms",
            NO_PEER,
        )
        top = ", ".join(
            f"{name} {value:.0f}"
            for name, value in list(found["beyond_floor_importtime_ms"].items())[:3]
        )
        for name in ENTRIES:
            if name in CLAIMED_ENTRIES:
                verdict = "holds" if found["holds"][name] else "FAILS"
                target = f"x{ratio[name]:.2f} the floor; aim: <= x{DIRECT_WITHIN}: {verdict}"
            else:
                target = f"x{ratio[name]:.2f} the floor"
            report.add(
                f"cold_import_{name}_ms",
                f"Cold import: lambda_handlers.{name}",
                ms[name],
                "ms",
                target,
            )
        report.add(
            "cold_import_direct_entry_ratio",
            "Cold import: slowest of wake, drain, deliver / floor",
            max(ratio[name] for name in CLAIMED_ENTRIES),
            "x",
            f"aim: <= x{DIRECT_WITHIN}; beyond the floor (importtime ms): {top}",
        )
        report.add(
            "cold_import_http_ms",
            "Cold import: handlers + functions.app + mangum (HTTP)",
            ms["http"],
            "ms",
            f"x{ratio['http']:.2f} the floor",
        )
        first = await measure_first_wake(server, sizes.first_wake_processes)
        found["first_wake"] = first
        imported = [m for m, seen in first["imported_after"].items() if seen]
        report.add(
            "cold_first_wake_beyond_import_ms",
            "First direct wake in a fresh process, beyond import",
            first["beyond_import_ms"],
            "ms",
            f"container {first['container_ms']:.0f} + wake {first['first_wake_ms']:.0f}; "
            f"imported after: {', '.join(imported) or 'no fastapi, mangum, boto3'}",
        )

    async def lambdawake() -> None:
        found = await measure_lambda_wake(server, sizes.lambda_wakes, sizes.lambda_wake_warmup)
        report.details["lambdawake"] = found
        beside = (
            f"{found['tables_served']} tables; "
            f"{found['statements_per_wake']:.0f} statements a wake; "
            f"{found['sent']} scheduler calls in {found['wakes']} wakes"
        )
        for p in ("p50", "p95"):
            report.add(
                f"lambda_wake_nothing_due_{p}_ms",
                f"Lambda wake (warm), nothing due: {p}",
                found["ms"][p],
                "ms",
                beside if p == "p50" else "",
            )

    async def schedulercalls() -> None:
        found = await measure_scheduler_calls(server, sizes.scheduler_runs)
        report.details["schedulercalls"] = found
        per = found["calls_per_1000_runs"]
        for phase, what in (("first_steps", "wake_in of 1-6 h"), ("second_steps", "then end")):
            counts = found[phase]
            ops = ", ".join(f"{op} {n}" for op, n in counts["sent_by_operation"].items())
            if phase == "first_steps":
                check = (
                    "one schedule, at the earliest"
                    if found["registered_is_earliest"]
                    else (
                        f"registered {found['registered_after_first']}, earliest "
                        f"{found['earliest_wake_at']}"
                    )
                )
            else:
                check = f"{found['schedules_left_at_end']} schedules left"
            report.add(
                f"scheduler_calls_per_1000_runs_{phase}",
                f"Scheduler API calls per 1,000 runs: steps that {what}",
                per[phase],
                "calls",
                f"{counts['sent']} in {found['runs']:,} runs ({ops or 'none'}); "
                f"{counts['wakes']} wakes, {counts['on_idle_calls']} on_idle; " + check,
            )

    async def graphs() -> None:
        found = await measure_transitions(server, sizes.update_seconds)
        report.details["graphs"] = found
        updates = found["update_transactions_per_s_8_clients"]
        ratio = found["ratio_to_updates"]
        raw = found["raw_autocommit_updates_per_s_8_clients"]
        report.add(
            "graph_transitions_per_s_8_clients",
            "Graph transitions/s, 8 clients",
            found["transitions_per_s"],
            "transitions/s",
            f"plain UPDATE transactions/s, same clients, this run: {updates:,.0f} (x{ratio:.2f}); "
            f"autocommit UPDATE/s: {raw:,.0f}",
        )
        for p in ("p50", "p95"):
            report.add(
                f"graph_transition_{p}_ms",
                f"One graph transition: {p}",
                found["latency_ms"][p],
                "ms",
                NO_PEER,
            )

    async def prune() -> None:
        found = await measure_prune(server, sizes.prune_old_rows, sizes.prune_new_rows)
        before, after = found.pop("before_ms"), found.pop("after_ms")
        alone = measures.percentiles(before + after)
        during = measures.percentiles(found.pop("with_prune_ms"))
        paused = measures.percentiles(found.pop("paused_ms"))
        found["claim_ms"] = {
            "alone": alone,
            "alone_before": measures.percentiles(before),
            "alone_after": measures.percentiles(after),
            "during_prune": during,
            "prune_paused": paused,
        }
        report.details["prune"] = found
        old, seconds = found["old_rows"], found["prune_seconds"]
        rows = f"{old:,} old of {old + found['new_rows']:,}"
        report.add("prune_dry_run_rows", f"duly prune dry run: rows counted ({rows})",
                   found["dry_run"]["rows"], "rows", NO_PEER)  # fmt: skip
        report.add("prune_deleted_rows", "duly prune --apply: rows deleted (exactly the old)",
                   found["deleted"], "rows", NO_PEER)  # fmt: skip
        report.add("prune_seconds", f"duly prune --apply: {found['batches']} batches of "
                   f"{found['batch_size']:,}, {found['pause_ms']} ms apart", seconds, "s",
                   NO_PEER)  # fmt: skip
        report.add("prune_rows_per_s", "duly prune --apply: rows deleted/s",
                   found["deleted"] / seconds if seconds else None, "rows/s", NO_PEER)  # fmt: skip
        window = found["window_s"]
        for p in ("p50", "p99"):
            report.add(f"prune_claim_alone_{p}_ms", f"Claim of 8, no prune ({BASELINE_SECONDS:g} "
                       f"s before and after): {p}", alone[p], "ms", NO_PEER)  # fmt: skip
            report.add(f"prune_claim_paused_{p}_ms", f"Claim of 8, prune paused ({window:g} s "
                       f"windows in turn): {p}", paused[p], "ms", NO_PEER)  # fmt: skip
            report.add(f"prune_claim_during_{p}_ms", f"Claim of 8, prune running ({window:g} s "
                       f"windows in turn): {p}", during[p], "ms", NO_PEER)  # fmt: skip
        report.add("prune_claim_p99_ratio", "Claim p99, prune running / paused (same span)",
                   during["p99"] / paused["p99"], "x", "target: at most 2")  # fmt: skip
        report.add("prune_claim_p99_ratio_alone", "Claim p99, prune running / no prune",
                   during["p99"] / alone["p99"], "x", "target: at most 2")  # fmt: skip

    async def console() -> None:
        found = await measure_console(server, sizes.console_runs, sizes.console_fetches)
        report.details["console"] = found
        slowest = max(page["ms"]["p95"] for page in found["pages"].values())
        for name, page in found["pages"].items():
            p95 = page["ms"]["p95"]
            verdict = "holds" if p95 <= CONSOLE_TARGET_MS else "FAILS"
            report.add(
                "console_" + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") + "_p95_ms",
                f"Console: {name}, {found['runs']:,} runs: p95 (p50 {page['ms']['p50']:.1f})",
                p95,
                "ms",
                f"target: <= {CONSOLE_TARGET_MS:g} ms: {verdict}",
            )
        report.add(
            "console_slowest_page_p95_ms",
            "Console: the slowest page's p95",
            slowest,
            "ms",
            f"target: <= {CONSOLE_TARGET_MS:g} ms",
        )

    async def search() -> None:
        found = await measure_search(server, sizes.search_runs, sizes.search_fetches)
        report.details["search"] = found
        for name, page in found["searches"].items():
            p95 = page["ms"]["p95"]
            verdict = "holds" if p95 < SEARCH_TARGET_MS else "FAILS"
            report.add(
                "search_" + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") + "_p95_ms",
                f"Search's first page, {name} ({page['filter'] or 'none'}), {found['runs']:,} "
                f"runs: p95 (p50 {page['ms']['p50']:.1f})",
                p95,
                "ms",
                f"target: < {SEARCH_TARGET_MS:g} ms: {verdict}",
            )

    plan: dict[str, tuple[str, Callable[[], Awaitable[None]]]] = {
        "reference": ("UPDATE commits/s, psycopg then pgbench", reference),
        "noop": (f"{sizes.noop_runs} one-step runs", noop),
        "effects": (
            f"{sizes.noop_runs} one-step runs, each publishing one event with its commit",
            effects,
        ),
        "pgqueuer": (f"pgqueuer's QueueManager on {sizes.noop_runs} no-op jobs", pgqueuer),
        "outbox": (
            f"{sizes.outbox_events} published events routed by one worker, at max_concurrency "
            f"{' then '.join(map(str, OUTBOX_CONCURRENCY))}",
            outbox,
        ),
        "publish": (
            f"{sizes.publish_transactions} transactions of each kind (after "
            f"{sizes.publish_warmup}): an INSERT, with publish_many of 0, 1 and 100 events",
            publish,
        ),
        "chain": (f"{sizes.chain_runs} three-step runs", chain),
        "latency": (
            f"{sizes.latency_runs} starts, {measures.START_EVERY * 1000:.0f} ms apart",
            latency,
        ),
        "scaling": (
            f"{sizes.scaling_runs} no-op runs drained by "
            f"{', '.join(map(str, SCALING_PROCESSES))} worker processes",
            scaling,
        ),
        "memory": (
            f"one worker's memory after {sizes.memory_first} and {sizes.memory_total} steps",
            memory,
        ),
        "timerload": (
            f"{sizes.timer_runs} wake_in timers while another process drains no-op batches",
            timerload,
        ),
        "timer": (
            f"{sizes.timer_runs} wake_in timers of 50-500 ms, "
            f"{measures.TIMER_START_EVERY * 1000:.0f} ms apart",
            timer,
        ),
        "deliver": (
            f"{sizes.deliver_runs} parked runs, one deliver() each from "
            f"{measures.DELIVER_TASKS} tasks",
            deliver,
        ),
        "starts": (
            f"{sizes.start_runs:,} runs started one at a time, then {sizes.start_runs:,} "
            f"with start_many in batches of {START_BATCH}, one client",
            starts,
        ),
        "fanout": (f"one parent fanning out {sizes.fanout_children} no-op children", fanout),
        "idle": (
            f"idle workers for {sizes.idle_window_seconds:g} s each, then "
            f"{sizes.idle_wakes} wake() calls",
            idle,
        ),
        "claims": (
            f"{sizes.claims} claims of {CLAIM_SIZE} from backlogs of "
            f"{', '.join(f'{n:,}' for n in sizes.claim_backlogs)} rows, with a limit and without",
            claims,
        ),
        "coldstart": (
            f"imports in {sizes.cold_processes} fresh processes each, then "
            f"{sizes.first_wake_processes} first wakes",
            coldstart,
        ),
        "lambdawake": (
            f"{sizes.lambda_wakes} warm Lambda wakes with nothing due (after "
            f"{sizes.lambda_wake_warmup})",
            lambdawake,
        ),
        "schedulercalls": (
            f"{sizes.scheduler_runs} wake_in runs woken through the Lambda wake, moto counting",
            schedulercalls,
        ),
        "graphs": (
            f"plain UPDATEs then graph transitions, 8 clients in 2 processes, "
            f"{sizes.update_seconds:g} s each",
            graphs,
        ),
        "prune": (
            f"duly prune of {sizes.prune_old_rows:,} old attempt-log rows (of "
            f"{sizes.prune_old_rows + sizes.prune_new_rows:,}), claims timed before and during",
            prune,
        ),
        "console": (
            f"every console page fetched {sizes.console_fetches} times over "
            f"{sizes.console_runs:,} runs",
            console,
        ),
        "search": (
            f"each kind of search's first page, {sizes.search_fetches} times over "
            f"{sizes.search_runs:,} runs",
            search,
        ),
    }
    for name in MEASUREMENTS:
        if name in only:
            description, measure = plan[name]
            progress(f"{name}: {description}")
            # Others' work on this machine moves every figure: keep the load beside them.
            report.details.setdefault("load_1min_before", {})[name] = os.getloadavg()[0]
            await attempt(name, description, measure())
    report.details["load_1min_at_end"] = os.getloadavg()[0]
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description="Benchmark one duly worker process.")
    parser.add_argument("--quick", action="store_true", help="every size ~5x smaller (smoke run)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the JSON here")
    parser.add_argument(
        "--only", default=",".join(MEASUREMENTS), help=f"a subset of {','.join(MEASUREMENTS)}"
    )
    parser.add_argument(
        "--pool-size", type=int, help="the worker's SQLAlchemy pool_size (default: SQLAlchemy's 5)"
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--statement-log",
        type=Path,
        metavar="DIR",
        help="the outbox workers' statements by kind, size and time, to DIR",
    )
    chosen.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="as --statement-log, and the outbox workers run under cProfile (stats to DIR)",
    )
    args = parser.parse_args(argv)
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    if unknown := args.only - set(MEASUREMENTS):
        parser.error(f"unknown measurement(s): {', '.join(sorted(unknown))}")
    return args


def progress(message: str) -> None:
    """A progress line on stderr, so stdout stays the table and the JSON."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Start the server, measure, print; stop the workers and the server whatever happens."""
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    # SIGTERM unwinds like Ctrl-C: asyncio cancels the measurement, whose blocks stop
    # their worker processes, and the finally below stops the server.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    progress("starting embedded PostgreSQL (fsync on)")
    server = start_embedded()
    try:
        diagnostics = args.profile or args.statement_log
        if diagnostics is not None:
            diagnostics.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(
            run_all(
                server,
                sizes,
                args.only,
                args.pool_size,
                progress,
                diagnostics,
                profile=args.profile is not None,
            )
        )
    except KeyboardInterrupt:
        progress("interrupted: worker processes and the server are stopped")
        return 130
    finally:
        server.stop()
    print(format_table(report))
    print()
    text = json.dumps(report.as_json(), indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
