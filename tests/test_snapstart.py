"""SnapStart's runtime hooks: registered by the entries, run on a real engine and real processes.

before-snapshot leaves the container no server connection (pg_stat_activity), the next
invocation connecting afresh, and has imported what a first invocation would (boto3; FastAPI
and the app for the http entry); after-restore gives each container restored from one snapshot
(here: fresh processes that all take one `random` state as theirs) values of its
own. The template's SnapStart option is read by tests/test_template.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from sqlalchemy import text

from functions.lambdas import handlers as lambda_handlers
from functions.lambdas.runtime import WAKE_INPUT
from tests.aws_fakes import create_tables, function, settings_for
from tests.conftest import Database
from tests.helpers import REPO_ROOT

LAMBDA_CONNECTIONS = text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND application_name = 'duly-lambda'"
)

# A "restore": a fresh process that imports the entries (registering the hooks), takes the
# snapshot's `random` state as its own, as a restored container has it, runs the after-restore
# hooks or not, and draws. (A fork is no model of it: CPython re-seeds `random` in a child.)
RESTORE = textwrap.dedent(
    """
    import json, random, sys
    import functions.lambdas.handlers
    from snapshot_restore_py import get_after_restore, get_before_snapshot

    state = json.loads(sys.stdin.read())
    random.setstate((state[0], tuple(state[1]), state[2]))
    if sys.argv[1] == "hooks":
        for hook, args, kwargs in get_after_restore():
            hook(*args, **kwargs)
    print(json.dumps({
        "before": [f"{h.__module__}.{h.__name__}" for h, _, _ in get_before_snapshot()],
        "after": [f"{h.__module__}.{h.__name__}" for h, _, _ in get_after_restore()],
        "drawn": random.getrandbits(64),
    }))
    """
)


async def test_before_snapshot_closes_every_connection_and_the_next_call_reconnects(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # a client is made, never called
    Session = await create_tables(db)
    from snapshot_restore_py import get_before_snapshot

    hooks = [hook for hook, _, _ in get_before_snapshot()]
    assert lambda_handlers.snapshots.before_snapshot in hooks
    async with function(settings_for(db)) as fn:
        assert (await fn.call(lambda_handlers.wake, WAKE_INPUT))["caught_up"] is True
        async with Session() as session:
            assert (await session.scalar(LAMBDA_CONNECTIONS) or 0) > 0, "the pool keeps some"
        fn.runtime.client("scheduler")  # a client made: its connections go too
        loop = asyncio.get_running_loop()
        for hook in hooks:  # on the container's thread, as Lambda runs them
            await loop.run_in_executor(fn._thread, hook)
        async with Session() as session:
            assert await session.scalar(LAMBDA_CONNECTIONS) == 0
        assert fn.runtime._container is None and fn.runtime._clients == {}
        # Restored, the container connects afresh on its first invocation.
        assert (await fn.call(lambda_handlers.wake, WAKE_INPUT))["caught_up"] is True


def restored(snapshot: str, hooks: bool) -> dict[str, Any]:
    """What one container restored from `snapshot` (random's state, as JSON) reports."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    ran = subprocess.run(
        [sys.executable, "-c", RESTORE, "hooks" if hooks else "plain"],
        input=snapshot, capture_output=True, text=True, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    found: dict[str, Any] = json.loads(ran.stdout.splitlines()[-1])
    return found


def test_after_restore_gives_each_restored_container_random_values_of_its_own() -> None:
    snapshot = json.dumps(random.Random(20261205).getstate())
    plain = [restored(snapshot, hooks=False) for _ in range(2)]
    assert plain[0]["drawn"] == plain[1]["drawn"], "without the hook they share random's state"
    hooked = [restored(snapshot, hooks=True) for _ in range(2)]
    assert hooked[0]["drawn"] != hooked[1]["drawn"]
    assert hooked[0]["before"] == ["functions.lambdas.snapshots.before_snapshot"]
    assert hooked[0]["after"] == ["functions.lambdas.snapshots.after_restore"]


def test_without_snapshot_restore_py_the_entries_import_and_register_nothing() -> None:
    probe = (
        "import sys\nsys.modules['snapshot_restore_py'] = None\n"
        "from functions.lambdas import snapshots, handlers\n"
        "print(snapshots.register())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO_ROOT
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["False"]


PRIME = textwrap.dedent(
    """
    import json, sys
    import functions.lambdas.handlers
    from snapshot_restore_py import get_before_snapshot

    WATCHED = ("boto3", "fastapi", "mangum", "functions.app")
    imported = [m for m in WATCHED if m in sys.modules]
    for hook, args, kwargs in get_before_snapshot():
        hook(*args, **kwargs)
    print(json.dumps({"imported": imported, "snapshot": [m for m in WATCHED if m in sys.modules]}))
    """
)


def test_before_snapshot_imports_what_the_first_invocation_would_and_the_http_entry_its_app() -> (
    None
):
    found = {}
    for handler in ("functions.lambdas.handlers.wake", "functions.lambdas.handlers.http"):
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "_HANDLER": handler}
        ran = subprocess.run(
            [sys.executable, "-c", PRIME], capture_output=True, text=True, env=env, cwd=REPO_ROOT
        )
        assert ran.returncode == 0, ran.stderr
        found[handler.rpartition(".")[2]] = json.loads(ran.stdout.splitlines()[-1])
    assert found["wake"]["imported"] == [] == found["http"]["imported"], "the entries stay lean"
    assert found["wake"]["snapshot"] == ["boto3"], "a direct entry's snapshot has no FastAPI"
    assert found["http"]["snapshot"] == ["boto3", "fastapi", "mangum", "functions.app"]
