"""Code other than the doors searches runs with names imported from `engine`, as the README
says of everything: `find_workflow`, `parse_filter`, `RunFilter` and `list_runs`."""

from __future__ import annotations

import re

import engine
from engine import RunFilter, connect_workflows, find_workflow, list_runs, parse_filter
from tests.conftest import Database
from tests.helpers import REPO_ROOT
from tests.test_run_search import ALL, failed_from, filled, newest


async def test_a_filter_read_and_a_page_listed_with_engine_s_names(db: Database) -> None:
    Session = await filled(db)
    async with connect_workflows(Session) as connection:
        info = find_workflow(connection, "payment")
        filters = parse_filter(info, "state:failed amount>=200")
        assert isinstance(filters, RunFilter)
        page = await list_runs(connection, info, filters, limit=100)
        everything = await list_runs(connection, info, limit=100)
    assert sorted(int(run.key) for run in page.runs) == failed_from(200)
    assert [run.key for run in everything.runs] == newest(list(ALL))


def test_the_readme_sends_its_readers_to_engine_alone() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "Everything is imported from `engine`" in readme
    # Public submodules only (`engine.testing`, `engine.dataclass`); the rest are private,
    # and what they hold is exported by `engine` (docs/api.md).
    named = set(re.findall(r"`(engine\.[a-z_]+)\.", readme))
    assert named <= {"engine.testing", "engine.dataclass"}
    assert {"find_workflow", "parse_filter", "RunFilter", "list_runs"} <= set(engine.__all__)
