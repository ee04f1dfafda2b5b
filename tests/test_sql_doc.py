"""docs/sql.md is generated from the engine's statement builders, and kept current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_docs_sql_md_is_current() -> None:
    checked = subprocess.run(
        [sys.executable, str(REPO / "docs" / "sql.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr or checked.stdout


def test_every_statement_shows_its_purpose_and_builder() -> None:
    page = (REPO / "docs" / "sql.md").read_text()
    sections = page.split("\n### ")[1:]
    assert len(sections) >= 25
    for section in sections:
        title, _, body = section.partition("\n\n")
        purpose = body.splitlines()[0]
        assert purpose.endswith("`)") and "(`engine." in purpose, title
        assert "```sql\n" in body, title
