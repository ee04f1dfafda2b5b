"""docs/explanation/guarantees.md: every promise names tests that exist, in the files it names.

Each section of the page ("## ...") names test files (`tests/....py`) and test
functions (`test_...`); a function named must be defined in one of the files its
section names, so a renamed or deleted test fails here rather than leaving a
promise held by nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "explanation" / "guarantees.md"
TEST_FILE = re.compile(r"`(tests/[\w/]+\.py)`")
TEST_NAME = re.compile(r"`(test_\w+)`")


def sections(text: str) -> list[str]:
    """The page's sections, each from its `## ` heading to the next."""
    return re.split(r"\n(?=## )", text)


def unheld(text: str) -> list[str]:
    """Each test a section names that none of its named files defines."""
    missing = []
    for section in sections(text):
        files = [REPO / path for path in TEST_FILE.findall(section)]
        defined = "\n".join(path.read_text() for path in files if path.is_file())
        missing += [f"{path.relative_to(REPO)} is no file" for path in files if not path.is_file()]
        for name in TEST_NAME.findall(section):
            if not re.search(rf"def {name}\(", defined):
                missing.append(f"{name} is defined in none of {[str(f) for f in files]}")
    return missing


def test_every_promise_names_tests_that_exist() -> None:
    text = PAGE.read_text()
    assert len(TEST_NAME.findall(text)) >= 20
    assert unheld(text) == []


def test_a_test_named_in_the_wrong_file_is_found() -> None:
    section = "## A\n`tests/test_runs.py`: `test_a_fenced_write_is_not_logged_on_either_path`"
    assert unheld(section) == [
        "test_a_fenced_write_is_not_logged_on_either_path is defined in none of "
        f"['{REPO / 'tests/test_runs.py'}']"
    ]
