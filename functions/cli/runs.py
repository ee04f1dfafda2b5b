"""`duly status`, `duly runs` and `duly show`: the operators' reads, as tables or JSON.

`duly show --wait SECONDS` waits for the run to end first, as the API's `?wait=` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import (
    DEFAULT_PAGE,
    ENGINE_COLUMNS,
    RUN_ORDERS,
    RUN_STATES,
    DulyError,
    EventTables,
    RunDetail,
    RunFilter,
    RunPage,
    WaitTimeoutError,
    WorkflowCounts,
    connect_workflows,
    find_workflow,
    json_value,
    list_runs,
    overview,
    parse_filter,
    run_detail,
    wait_for_end,
)
from functions.cli.common import (
    SET_UP_ERRORS,
    Commands,
    add_database_url,
    app_database,
    on_database,
    set_up_refused,
)
from functions.cli.output import aligned, refused
from functions.requests.runs import url_key
from infra.app_config import mapped_event_tables

SHOWN_ATTEMPTS = 50  # a run's newest attempts `duly show` prints


def add_runs(commands: Commands) -> None:
    """`duly status`, `duly runs` and `duly show`: the counts, a page of a workflow's runs, one
    run with its history."""
    status = commands.add_parser(
        "status", help="every workflow table's runs by state, the next due instant, the outbox"
    )
    add_database_url(status)
    status.add_argument("--json", action="store_true", help="print JSON, for scripts")
    status.set_defaults(command=run_status)
    runs = commands.add_parser(
        "runs", help="a page of a workflow's runs, filtered, newest or soonest due first"
    )
    add_database_url(runs)
    runs.add_argument("workflow", metavar="WORKFLOW", help="the workflow's table name")
    runs.add_argument("--state", choices=RUN_STATES, help="only runs in this state")
    runs.add_argument("--step", help="only runs at this step (their next step)")
    runs.add_argument("--key", help="only the run with this key")
    runs.add_argument("--error", help="only runs whose last error contains this text")
    runs.add_argument(
        "--where",
        metavar="TEXT",
        help="a filter, e.g. 'state:failed error:\"card declined\" since:1h' (the operating "
        "guide's search terms)",
    )
    runs.add_argument("--order", choices=RUN_ORDERS, default="newest", help="default: newest")
    runs.add_argument(
        "--limit", type=int, default=DEFAULT_PAGE, help=f"runs a page (default {DEFAULT_PAGE})"
    )
    runs.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    runs.add_argument("--json", action="store_true", help="print JSON, for scripts")
    runs.set_defaults(command=run_runs)
    show = commands.add_parser("show", help="one run: its row, what it waits for, its history")
    add_database_url(show)
    show.add_argument("workflow", metavar="WORKFLOW", help="the workflow's table name")
    show.add_argument("key", metavar="KEY", help="the run's key (a JSON list if composite)")
    show.add_argument(
        "--attempts", type=int, default=SHOWN_ATTEMPTS, help=f"newest attempts shown "
        f"(default {SHOWN_ATTEMPTS})"
    )  # fmt: skip
    show.add_argument(
        "--failures", action="store_true", help="every failed attempt's arguments and "
        "traceback shown (default: the newest one's)"
    )  # fmt: skip
    show.add_argument(
        "--wait",
        type=wait_seconds,
        metavar="SECONDS",
        help="wait up to SECONDS for the run to end (finished, failed, cancelled), then show it",
    )
    show.add_argument("--json", action="store_true", help="print JSON, for scripts")
    show.set_defaults(command=run_show)


def wait_seconds(given: str) -> float:
    """`--wait`'s value: a number of seconds, 0 or more."""
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"a number of seconds, 0 or more, not {given!r}")
    return seconds


def run_status(args: argparse.Namespace) -> int:
    """`duly status`: every workflow table's runs by state, and the outbox, as a table or JSON."""
    try:
        url, _, metadatas = app_database(args, "duly status")
        tables = mapped_event_tables(metadatas)
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(print_status, tables=tables, as_json=args.json, out=sys.stdout)
    return asyncio.run(on_database(url, command))


async def print_status(
    Session: async_sessionmaker[AsyncSession],
    *,
    tables: EventTables | None,
    as_json: bool,
    out: TextIO,
) -> int:
    """Count each workflow table's runs by state (the queries of `GET /overview`) and print."""
    async with connect_workflows(Session) as connection:
        found = await overview(connection, tables)
    if as_json:
        print(json.dumps(found.to_dict(), indent=2), file=out)
        return 0
    outbox = found.outbox
    print(status_table(found.workflows), file=out)
    if found.stranded:
        print("\nstranded (due longer than the grace period; no worker has taken them):", file=out)
        for runs in found.stranded:
            print(f"  {runs.workflow} at {runs.step}: {runs.runs} runs, the oldest due since "
                  f"{runs.since:%Y-%m-%d %H:%M:%S}; run a step with by(...).run(...) or "
                  "cancel()", file=out)  # fmt: skip
    if outbox is not None:
        counts = ", ".join(f"{status} {n}" for status, n in outbox.counts.items())
        print(f"\noutbox: {counts}; next due {outbox.next_due_at or '-'}", file=out)
        for handler in outbox.handlers:
            print(f"  {handler.handler}: {handler.failed} failed, "
                  f"{handler.dead_letter} dead letters", file=out)  # fmt: skip
    return 0


def status_table(workflows: Sequence[WorkflowCounts]) -> str:
    """The overview as aligned columns: one line a workflow table."""
    header = ["workflow", "due", *RUN_STATES, "stranded", "next due"]
    lines = [header]
    for counts in workflows:
        next_due = counts.next_due.strftime("%Y-%m-%d %H:%M:%S") if counts.next_due else "-"
        states = [str(counts.states[s]) for s in RUN_STATES]
        lines.append([counts.workflow, str(counts.due), *states, str(counts.stranded), next_due])
    # The counts right-aligned; the names and the instant as they read.
    return aligned(lines, right=set(range(1, len(header) - 1)))


def run_runs(args: argparse.Namespace) -> int:
    """`duly runs`: a page of a workflow's runs (the console's and the API's query)."""
    try:
        url, _, _ = app_database(args, "duly runs")
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    filters = RunFilter(state=args.state, step=args.step, key=args.key, error=args.error)
    command = functools.partial(print_runs, args=args, filters=filters, out=sys.stdout)
    return asyncio.run(on_database(url, command))


async def print_runs(
    Session: async_sessionmaker[AsyncSession],
    *,
    args: argparse.Namespace,
    filters: RunFilter,
    out: TextIO,
) -> int:
    """Read one page of runs and print it as a table or JSON; the next page's cursor after."""
    async with connect_workflows(Session) as connection:
        try:
            info = find_workflow(connection, args.workflow)
            if args.where is not None:
                filters = parse_filter(info, args.where).also(filters)
            page = await list_runs(
                connection, info, filters, order=args.order, limit=args.limit, after=args.after
            )
        except DulyError as exc:
            return refused(exc)
    if args.json:
        document = {
            "workflow": page.workflow,
            "runs": [run.to_dict() for run in page.runs],
            "next_after": page.next_after,
            "searching": page.searching,
        }
        print(json.dumps(json_value(document), indent=2), file=out)
        return 0
    print(runs_table(page), file=out)
    if page.next_after is not None:
        more = "the search goes on" if page.searching else "next page"
        print(f"\n{more}: duly runs {args.workflow} ... --after {page.next_after}", file=out)
    return 0


def runs_table(page: RunPage) -> str:
    """A page of runs as aligned columns: one line a run."""
    lines = [["key", "state", "next step", "due", "attempts", "last error"]]
    for run in page.runs:
        due = run.row.get("wake_at")
        error = (run.row.get("last_error") or "").splitlines()[0:1]
        lines.append([
            run.key,
            run.state,
            next_step_of(run.row.get("next_step"), run.waiting_for),
            due.strftime("%Y-%m-%d %H:%M:%S") if due else "-",
            str(run.row.get("attempts", 0)),
            (error[0][:60] if error else "-"),
        ])  # fmt: skip
    if len(lines) == 1:
        return f"no {page.workflow} run matches"
    return aligned(lines, right={4})


def next_step_of(step: str | None, waiting_for: str | None) -> str:
    """A run's next step as the table says it: `chase (waits for pay)` for a wait with a
    timeout, `(pay)` for one without, `-` when nothing is next."""
    if waiting_for is None:
        return step or "-"
    return f"{step} (waits for {waiting_for})" if step else f"({waiting_for})"


def run_show(args: argparse.Namespace) -> int:
    """`duly show`: one run with its history (the console's and the API's query)."""
    try:
        url, _, _ = app_database(args, "duly show")
    except SET_UP_ERRORS as exc:
        return set_up_refused(exc)
    command = functools.partial(print_run, args=args, out=sys.stdout)
    return asyncio.run(on_database(url, command))


async def print_run(
    Session: async_sessionmaker[AsyncSession],
    *,
    args: argparse.Namespace,
    out: TextIO,
) -> int:
    """Read one run in full and print it, or its JSON."""
    async with connect_workflows(Session) as connection:
        try:
            info = find_workflow(connection, args.workflow)
            key = url_key(info, args.key)
            if args.wait:
                with contextlib.suppress(WaitTimeoutError):
                    await wait_for_end(info, key.where(info), args.wait)
            detail = await run_detail(connection, info, key, attempts=max(args.attempts, 0))
        except DulyError as exc:
            return refused(exc)
    if args.json:
        document = {
            **detail.to_dict(),
            "engine": detail.engine,
            "children": None if detail.children is None else [asdict(c) for c in detail.children],
            "earlier_attempts": detail.earlier,
            "now": detail.now,
        }
        print(json.dumps(json_value(document), indent=2), file=out)
        return 0
    print(run_text(detail, every_failure=args.failures), file=out)
    return 0


def run_text(detail: RunDetail, *, every_failure: bool = False) -> str:
    """A run as people read it: where it stands, its row, its newest attempts."""
    run = detail.summary
    when = run.row.get("wake_at")
    facts = [
        ("state", run.state),
        ("next step", run.row.get("next_step") or "-"),
        ("due", when.strftime("%Y-%m-%d %H:%M:%S %Z") if when else "-"),
        ("attempts", str(run.row.get("attempts", 0))),
    ]
    if run.waiting_for:
        facts.append(("waits for", f"{run.waiting_for} (until {run.deadline or 'an event'})"))
    if run.parent:
        facts.append(("parent", json.dumps(run.parent)))
    if run.children_left is not None:
        facts.append(("children left", str(run.children_left)))
    for child in detail.children or []:
        facts.append(("child", f"{child.workflow} {child.key} ({child.state})"))
    own = {k: v for k, v in run.row.items() if k not in ENGINE_COLUMNS}
    facts += [(name, json.dumps(json_value(value))) for name, value in own.items()]
    width = max(len(name) for name, _ in facts)
    lines = [f"{run.workflow} {run.key}"]
    lines += [f"  {name.ljust(width)}  {value}" for name, value in facts]
    if run.row.get("last_error"):
        lines += ["  last error:", *(f"    {line}" for line in run.row["last_error"].splitlines())]
    if detail.history is None:
        lines.append("\nno attempt log is mapped: no history")
    elif not detail.history:
        lines.append(f"\n{detail.no_attempts_text()}")
    else:
        rows = [["finished", "step", "attempt", "outcome", "took", "error"]]
        for attempt in detail.history:
            error = (attempt.get("error") or "").splitlines()[0:1]
            rows.append([
                attempt["finished_at"].strftime("%Y-%m-%d %H:%M:%S"),
                attempt["step"],
                str(attempt["attempt"]),
                attempt["outcome"],
                f"{attempt['took_ms']:.1f} ms",
                error[0][:60] if error else "",
            ])  # fmt: skip
        earlier = " (older ones left out: --attempts)" if detail.earlier else ""
        lines += [f"\nattempts, oldest first{earlier}:", aligned(rows, right={2, 4})]
        lines += failures_text(detail.failed_attempts(), every_failure=every_failure)
    return "\n".join(lines)


def failures_text(failed: Sequence[dict[str, Any]], *, every_failure: bool) -> list[str]:
    """The newest failed attempt's arguments and traceback (each one's, oldest first, with
    `every_failure`), and how to see the others."""
    shown = failed if every_failure else failed[-1:]
    lines: list[str] = []
    for attempt in shown:
        when = attempt["finished_at"].strftime("%Y-%m-%d %H:%M:%S")
        lines += [
            f"\n{attempt['step']} attempt {attempt['attempt']} ({attempt['outcome']}, {when}):",
            f"  arguments: {json.dumps(json_value(attempt.get('args')))}",
        ]
        trace = attempt.get("traceback")
        if trace:
            lines += ["  traceback:", *(f"    {line}" for line in trace.splitlines())]
        else:
            lines.append("  traceback: none kept (logged before duly kept them)")
    if len(failed) > len(shown):
        lines.append(f"\n{len(failed) - 1} earlier failed attempts: --failures shows each")
    return lines
