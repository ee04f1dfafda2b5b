"""A Lambda cold start pays for what the app uses: the wake path of plain workflows.

In a fresh process, importing the direct entries and then running a wake of an
app of plain workflows (tests.apps.plain_wake: no outbox, no graph, steps
without arguments) loads no event layer, no graph layer, no execution engine,
no retention, no operators' views, no request models and no pydantic. The
scheduler is a stand-in that records what it is told (the AWS side is not what
is under test here; tests/test_lambda_handlers.py runs it on moto).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from sqlalchemy import select

from engine import connect_workflows
from tests.apps.plain_wake import Base, Ping
from tests.conftest import Database
from tests.helpers import REPO_ROOT

# Modules of what a wake of plain workflows does not use, by prefix.
UNUSED = (
    "engine.events.",  # but engine.events.statuses, which the CloudWatch metrics compare with
    "engine.graphs",
    "engine.executions",
    "engine.retention",
    "engine.views",
    "engine.tables",
    "functions.requests.runs",
    "functions.requests.events",
    "functions.requests.lookup",
    "functions.http",
    "pydantic",
    "fastapi",
)
ALLOWED = {"engine.events.statuses"}

PROBE = textwrap.dedent(
    """
    import json, sys, time
    import functions.lambdas.handlers as handlers
    imported = sorted(sys.modules)
    from functions.lambdas.runtime import Runtime

    class Recording:
        def __init__(self, rt, engine):
            self.told = []
        async def on_idle(self, at):
            self.told.append(at)
        async def kick(self):
            return None

    class Context:
        invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:wake"
        aws_request_id = "cold-start"
        def get_remaining_time_in_millis(self):
            return 30_000

    rt = Runtime(scheduler=Recording)
    answer = handlers.handle(handlers.work.wake, {"duly": "wake"}, Context(), rt)
    rt.close()
    print(json.dumps({"imported": imported, "woken": sorted(sys.modules), "answer": answer}))
    """
)


def unused(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(UNUSED) and m not in ALLOWED]


async def test_a_wake_of_plain_workflows_loads_nothing_it_does_not_use(db: Database) -> None:
    Session = await db.create(Base.metadata)
    async with connect_workflows(Session, workflows=[Ping]):
        assert await Ping(id=1).start(Ping.ping)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "DULY_APP": "tests.apps.plain_wake",
        "DULY_DATABASE_URL": db.url,
        "DULY_SCHEDULE_GROUP": "duly-cold-start",
        "DULY_WAKE_FUNCTION_ARN": "arn:aws:lambda:eu-west-1:123456789012:function:wake",
        "DULY_SCHEDULER_ROLE_ARN": "arn:aws:iam::123456789012:role/duly-scheduler",
    }
    ran = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO_ROOT
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.splitlines()[-1])
    # ping goes straight on to pong: one claim, one step started.
    assert found["answer"]["steps"] == 1 and found["answer"]["caught_up"] is True, found["answer"]
    assert unused(found["imported"]) == [], "imported by the entries"
    assert unused(found["woken"]) == [], "imported by a wake of plain workflows"
    async with Session() as session:
        assert (await session.scalars(select(Ping.answered))).all() == [True]
