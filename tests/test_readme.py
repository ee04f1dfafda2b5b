"""The README's example runs as written: its module is imported and its test passes.

The README is a project of its own, as a how-to page is (tests/docs_examples.py): each
titled Python block is a file, run the way the docs' examples are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.testing.pytest_plugin import Server
from tests.docs_examples import REPO_ROOT, Example, assert_example_runs, project_examples

README = REPO_ROOT / "README.md"
EXAMPLES = project_examples(REPO_ROOT, [README], tutorial=False)
MOST_LINES = 250  # a README read in five minutes; the rest is the documentation site


def test_the_readme_is_short_and_has_its_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MOST_LINES
    setup = "python -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]'"
    assert f"{setup} && duly dev\n{setup} && pytest\n" in text
    assert [example.block.title for example in EXAMPLES] == [
        "src/welcome/onboarding.py",
        "tests/test_onboarding.py",
    ]


@pytest.mark.parametrize("example", [pytest.param(e, id=e.block.name) for e in EXAMPLES])
async def test_the_readme_example_runs(example: Example, server: Server, tmp_path: Path) -> None:
    await assert_example_runs(example, server, tmp_path / "project")
