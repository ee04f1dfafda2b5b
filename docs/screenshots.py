"""Make the documentation's screenshots of the console, from a real `duly dev`.

    python docs/screenshots.py              # write docs/images/*.png
    python docs/screenshots.py --out DIR    # write them somewhere else

It starts `duly dev` on a free port with a temporary data directory (your
`.duly/` is never touched) and named API keys, so the console is seen as a
person sees it once a credential is set: logged in, acting as themselves.
It makes what the pages show through the HTTP API and the command line,
moves the clock, and takes each page in Debian's headless Chromium, 1280 px wide.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from playwright.sync_api import Browser, Page, sync_playwright

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere in the repository

from functions.cli.keys import new_entry  # noqa: E402
from tests.helpers import free_port  # noqa: E402

CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"
WIDTH = 1280
IMAGES = (
    "overview.png",
    "run-timeline.png",
    "run-failure.png",
    "graph-instance.png",
    "search.png",
    "designer.png",
    "schedules.png",
)
# Who holds a key: roles, groups. mia runs operations and designs graphs; the others approve.
PEOPLE = {
    "mia": (["operator", "designer"], []),
    "sam": (["viewer"], []),
    "lee": (["viewer"], []),
    "fay": (["viewer"], ["finance"]),
    "fred": (["viewer"], ["finance"]),
}
SEARCH = "state:scheduled step:check"
# Stored arguments that `Onboarding.activated(self, plan)` no longer takes, as an older
# deploy can leave them: the examples have no step that fails on demand.
MISFIT_ARGS = '{"args": ["pro", "annual"], "kwargs": {}}'
STARTUP = 60.0  # seconds duly dev may take to answer
SETTLE = 20.0  # seconds a run may take to reach the state asked for


class Dev:
    """A `duly dev` subprocess and a client that calls its API as one of PEOPLE."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys: dict[str, str] = {}
        entries = []
        for name, (roles, groups) in PEOPLE.items():
            self.keys[name], entry = new_entry(name, roles, groups)
            entries.append(entry)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DULY_")}
        env.update(
            PYTHONPATH=str(ROOT),
            DULY_DATA_DIR=str(data_dir / "pgdata"),
            DULY_API_KEYS=json.dumps(entries),
        )
        self.env = env
        self.cwd = data_dir
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def duly(self, *args: str) -> list[str]:
        """The `duly` command with these arguments, as this server's environment runs it."""
        return [sys.executable, "-m", "functions.cli", *args]

    def call(self, who: str, method: str, path: str, body: Any = None) -> Any:
        """`who` calls the API; the answer's JSON (it must succeed)."""
        auth = {"Authorization": f"Bearer {self.keys[who]}"}
        reply = self.http.request(method, path, json=body, headers=auth)
        if reply.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {reply.status_code} {reply.text}")
        return reply.json() if reply.content else None

    def start(self, workflow: str, step: str, row: dict[str, Any]) -> str:
        """A run of `workflow` started at `step` with `row`; its key."""
        path = f"/workflows/{workflow}/start"
        return str(self.call("mia", "POST", path, {"row": row, "step": step})["key"])

    def run(self, workflow: str, key: str) -> dict[str, Any]:
        reply: dict[str, Any] = self.call("mia", "GET", f"/workflows/{workflow}/runs/{key}")
        return reply

    def until(self, workflow: str, key: str, shown: Callable[[dict[str, Any]], bool]) -> None:
        """Wait until the run satisfies `shown` (the worker runs it meanwhile)."""
        deadline = time.monotonic() + SETTLE
        while not shown(found := self.run(workflow, key)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{workflow}[{key}] stayed {found['state']}")
            time.sleep(0.2)

    def move_clock(self, days: int) -> None:
        self.call("mia", "POST", "/dev/clock", {"days": days})


@contextmanager
def serving(data_dir: Path) -> Iterator[Dev]:
    """`duly dev` started and answering; stopped (and its PostgreSQL with it) on the way out."""
    dev = Dev(data_dir)
    log = (data_dir / "duly-dev.log").open("w")
    command = dev.duly("dev", "--port", str(dev.port))
    process = subprocess.Popen(command, cwd=dev.cwd, env=dev.env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + STARTUP
        while not answers(dev):
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                said = Path(log.name).read_text()[-3000:]
                raise RuntimeError(f"duly dev did not start; it said:\n{said}")
            time.sleep(0.3)
        yield dev
    finally:
        process.terminate()
        try:
            process.wait(STARTUP)
        except subprocess.TimeoutExpired:
            process.kill()
        dev.http.close()
        log.close()


def answers(dev: Dev) -> bool:
    try:
        return dev.http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def onboard(dev: Dev, *users: str) -> list[str]:
    """Onboarding runs for these users, each waiting for its check; their keys."""
    keys = [
        dev.start("onboarding", "welcome", {"user_id": u, "email": f"{u}@example.com"})
        for u in users
    ]
    for key in keys:
        dev.until("onboarding", key, lambda run: run["row"]["next_step"] == "check")
    return keys


def fail(dev: Dev, key: str) -> None:
    """Leave arguments an older signature took on a run, due now; it fails at its next try."""
    url = subprocess.run(
        dev.duly("db-url"), env=dev.env, cwd=dev.cwd, capture_output=True, text=True, check=True
    ).stdout.strip()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE onboarding SET next_step = 'activated', next_args = %s::jsonb, "
            "wake_at = now() - interval '1 second' WHERE id = %s",
            (MISFIT_ARGS, int(key)),
        )
    dev.until("onboarding", key, lambda run: run["state"] == "failed")


def stage(dev: Dev) -> dict[str, str]:
    """Runs in every state, a failure, schedules and a graph instance; what the pages show."""
    onboard(dev, "ana", "ben")
    dev.move_clock(3)
    dev.until("onboarding", "1", lambda run: len(run["history"]) == 2)  # the demo run's check
    onboard(dev, "cho", "dev")
    dev.move_clock(4)
    dev.until("onboarding", "1", lambda run: run["state"] == "finished")
    _eli, fia, gus, hal = onboard(dev, "eli", "fia", "gus", "hal")  # eli stays scheduled
    dev.call("mia", "POST", "/workflows/onboarding/cancel", {"key": gus})
    activated = {"key": fia, "step": "activated", "args": {"plan": "pro"}}
    dev.call("mia", "POST", "/workflows/onboarding/run", activated)
    fail(dev, hal)
    dev.call("mia", "POST", "/dev/expenses", {"expense_id": 7, "amount": 120})
    dev.start("research", "research_all", {"name": "acme", "companies": ["Initech", "Globex"]})
    daily = dev.start("digest", "send", {"name": "sales-daily"})
    dev.start("digest", "send", {"name": "ops-weekly"})
    dev.until("digest", daily, lambda run: len(run["history"]) == 1)
    dev.call("mia", "POST", f"/workflows/digest/runs/{daily}/schedule/pause")

    claim = dev.call(
        "mia",
        "POST",
        "/dev/expense-claims",
        {"title": "Team offsite in Lisbon", "amount": 2400, "submitted_by": "sam"},
    )
    submit = {k: claim[k] for k in ("subject_type", "subject_key", "workflow")}
    instance = dev.call("sam", "POST", "/graphs/instances", submit)
    moves = (("mia", "Approve", "Within the team's budget."), ("lee", "Legal approves", ""))
    for who, label, comment in (*moves, ("fay", "Finance approves", "")):
        path = f"/graphs/instances/{instance['id']}/transitions"
        offered = dev.call(who, "GET", path)["transitions"]
        [choice] = [c for c in offered if c["display_name"] == label]
        body = {"branch_id": choice["branch_id"], "target_id": choice["target_id"]}
        dev.call(who, "POST", path, {**body, "comment": comment})
    return {"failed": hal, "instance": instance["id"], "template": instance["template_id"]}


def logged_in(browser: Browser, dev: Dev, who: str) -> Page:
    """A page of a fresh browser context, logged in to the console with `who`'s key."""
    context = browser.new_context(base_url=dev.url, viewport={"width": WIDTH, "height": 800})
    page = context.new_page()
    page.goto("/console/login")
    page.get_by_label("API key or token").fill(dev.keys[who])
    page.get_by_role("button", name="Log in with the key").click()
    page.wait_for_url(f"{dev.url}/console")
    return page


def shoot(dev: Dev, shown: dict[str, str], out: Path) -> None:
    """Every page of IMAGES, as mia (operations) and fred (an approver with a vote to cast)."""
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        mia = logged_in(browser, dev, "mia")

        def take(name: str, path: str, page: Page = mia) -> Page:
            page.goto(path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=out / name, full_page=True)
            return page

        take("overview.png", "/console")
        take("run-timeline.png", "/console/runs/onboarding/1")
        mia.goto(f"/console/runs/onboarding/{shown['failed']}")
        mia.locator("details.failure summary").first.click()
        mia.screenshot(path=out / "run-failure.png", full_page=True)
        take("search.png", f"/console/runs/onboarding?{httpx.QueryParams(q=SEARCH)}")
        take("designer.png", f"/console/graphs/designer/{shown['template']}")
        take("schedules.png", "/console/schedules")
        fred = logged_in(browser, dev, "fred")
        take("graph-instance.png", f"/console/graphs/instances/{shown['instance']}", fred)
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS / "images", help="where to write")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="duly-screenshots-") as scratch,
        serving(Path(scratch)) as dev,
    ):
        shoot(dev, stage(dev), args.out)
    for name in IMAGES:
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
