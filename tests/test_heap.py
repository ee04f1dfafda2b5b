"""The collector is set once per process when a worker starts (engine.worker.heap).

- settle() freezes the objects alive then and raises the young generation's
  threshold from CPython's default; a second call does nothing.
- A threshold the application chose is left as it is.
- DULY_GC_TUNING=0 leaves the collector alone.
- A worker settles the heap when it starts.

Each case runs in a fresh interpreter: the collector's settings are the process's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from engine import run_workflows
from engine.worker import heap
from tests.apps import behaviour
from tests.apps.behaviour import Held
from tests.conftest import Database
from tests.helpers import REPO_ROOT

PROBE = """
import gc, json
{before}
from engine.worker import heap
first = heap.settle()
second = heap.settle()
print(json.dumps({{"first": first, "second": second, "frozen": gc.get_freeze_count(),
                  "threshold": gc.get_threshold()}}))
"""


def settle_in_fresh_process(before: str = "", **env: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        check=True,
    )
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_settle_freezes_the_heap_and_raises_the_young_threshold_once() -> None:
    found = settle_in_fresh_process()
    assert found["first"] is True and found["second"] is False
    assert found["frozen"] > 10_000  # the interpreter, SQLAlchemy and the engine, imported
    assert found["threshold"][0] == 7_000


def test_a_threshold_the_application_chose_is_kept() -> None:
    found = settle_in_fresh_process("gc.set_threshold(1234, 10, 10)")
    assert found["first"] is True
    assert found["threshold"] == [1234, 10, 10]


def test_the_setting_turns_it_off() -> None:
    found = settle_in_fresh_process(DULY_GC_TUNING="0")
    assert found["first"] is False
    assert found["frozen"] == 0
    assert found["threshold"][0] == 700


async def test_a_worker_settles_the_heap_when_it_starts(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(heap.SETTING, raising=False)
    monkeypatch.setattr(heap.gc, "get_freeze_count", lambda: 0)  # no worker ran here yet
    Session = await db.create(behaviour.Base.metadata)
    async with run_workflows(Session, workflows=[Held]):
        monkeypatch.undo()
        assert heap.settle() is False  # done already, by the worker's start
