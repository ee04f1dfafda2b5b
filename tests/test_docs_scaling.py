"""docs/scaling.md: every figure names the bench command that took it, and says how it was got.

A figure is a number followed by a unit (steps/s, ms, µs, B, MB/s, connections,
wakes...). Each paragraph, list or table holding one must name a `bench/`
command and say whether its figures are measured or extrapolated.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "scaling.md"
UNIT = (
    r"(?:steps?|commits?|runs?|events?|jobs?|starts?|flushes|syncs|writes|statements)/s"
    r"|[kMG]?B/s|[kMG]?B\b|ms\b|µs\b|s\b|seconds?\b|minutes?\b|hours?\b"
    r"|connections?\b|wakes?\b|steps?\b|commits?\b|flushes\b|vCPUs?\b|tables\b|statements\b"
)
# A number (digits, thousands separators, a decimal part) and then, after a space, its unit.
FIGURE = re.compile(r"(?<![\w.,-])\d[\d,]*(?:\.\d+)?\s+(?:" + UNIT + ")")
BENCH_COMMAND = re.compile(r"bench/[\w.]+\.py")
HOW_GOT = re.compile(r"\b(?:measured|extrapolated)\b", re.IGNORECASE)


def blocks(text: str) -> list[str]:
    """The page's paragraphs, lists and tables: runs of lines between blank lines."""
    return [block for block in re.split(r"\n\s*\n", text) if block.strip()]


def unsourced(text: str) -> list[str]:
    """Each block with a figure that names no bench command or says not how it was got."""
    found = []
    for block in blocks(text):
        if block.lstrip().startswith("#"):
            continue  # a heading
        figures = FIGURE.findall(block)
        if figures and not (BENCH_COMMAND.search(block) and HOW_GOT.search(block)):
            found.append(f"{figures[0]!r} in: {block[:120]}")
    return found


def test_every_figure_names_its_bench_command_and_how_it_was_got() -> None:
    assert unsourced(PAGE.read_text()) == []


def test_the_page_has_figures_to_check() -> None:
    """The check above is not vacuous: the page quotes many figures, in most of its blocks."""
    text = PAGE.read_text()
    assert len(FIGURE.findall(text)) >= 40
    assert sum(1 for block in blocks(text) if FIGURE.search(block)) >= 10


def test_the_check_finds_a_figure_without_its_command() -> None:
    bare = "One primary runs 10,000 steps/s.\n\nA wake holds 2 connections, measured."
    assert len(unsourced(bare)) == 2
    sourced = (
        "One primary runs 10,000 steps/s (extrapolated from `bench/run.py --only scaling`).\n"
        "\n| steps/s (measured, bench/run.py) |\n|---|\n| 4,627 steps/s |"
    )
    assert unsourced(sourced) == []
    assert unsourced("A 2-vCPU machine, version 18.6, set to 4.") == []


def test_the_page_is_in_the_site_and_linked_from_the_scaling_guide() -> None:
    assert "Scaling, measured: scaling.md" in (REPO / "mkdocs.yml").read_text()
    guide = (REPO / "docs" / "how-to" / "scaling.md").read_text()
    assert guide.count("(../scaling.md") >= 4  # the page, and its sections the guide cites
