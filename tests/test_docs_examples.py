"""Every Python block of the tutorial and how-to pages runs (tests/docs_examples.py).

One test a block, named by its page, line and title: a file of the page's project is
imported, run by pytest or run as a script; an excerpt is skipped by its name; a block
with no title fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.testing.pytest_plugin import Server
from tests.docs_examples import Example, assert_example_runs, collect_examples

EXAMPLES = collect_examples()


@pytest.mark.parametrize("example", [pytest.param(e, id=e.block.name) for e in EXAMPLES])
async def test_the_example_runs(example: Example, server: Server, tmp_path: Path) -> None:
    await assert_example_runs(example, server, tmp_path / "project")
