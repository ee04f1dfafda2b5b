"""The docs' examples runner (tests/docs_examples.py), on tiny sample pages of its own."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from infra.testing.pytest_plugin import Server
from tests.docs_examples import Example, Outcome, collect_examples, parse_blocks, run_example

FENCE = "```"
PASSED = Outcome("passed")
ORDERS = """\
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from engine import Workflow, declare_engine_tables, step


class Base(DeclarativeBase):
    pass


class Order(Base, Workflow):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(default="new")

    @step
    async def pay(self) -> None:
        self.status = "paid"


engine_tables = declare_engine_tables(Base)
"""
PAID_TEST = """\
from shop.orders import Order


async def test_an_order_is_paid(duly_session, duly_connection, duly_drain, paid):
    order = Order()
    assert await order.start(Order.pay)
    assert await duly_drain() == 1
    async with duly_session() as session:
        assert (await session.get(Order, order.id)).status == paid
"""
CONFTEST = """\
import pytest


@pytest.fixture
def paid():
    return "paid"
"""
COUNT_SCRIPT = """\
import os

import psycopg

with psycopg.connect(os.environ["DULY_DATABASE_URL"]) as conn:
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
"""


def fenced(language: str, code: str, title: str | None = None, indent: str = "") -> str:
    """A fenced block as a page writes it."""
    info = language + (f' title="{title}"' if title is not None else "")
    text = f"{FENCE}{info}\n{code}{FENCE}\n"
    return textwrap.indent(text, indent) if indent else text


def write_page(docs: Path, page: str, *parts: str) -> None:
    (docs / page).parent.mkdir(parents=True, exist_ok=True)
    (docs / page).write_text("# A page\n\nSome prose.\n\n" + "\n".join(parts))


def by_name(docs: Path) -> dict[str, Example]:
    return {example.block.name: example for example in collect_examples(docs)}


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    return tmp_path / "docs"


def test_without_pages_nothing_is_collected(docs: Path) -> None:
    assert collect_examples(docs) == []


def test_each_python_block_is_one_example_named_by_its_page_line_and_title(docs: Path) -> None:
    write_page(
        docs,
        "how-to/orders.md",
        fenced("sh", "pip install duly\n"),
        fenced("python", ORDERS, "src/shop/orders.py"),
        "!!! note\n\n" + fenced("python", "self.status = 'x'\n", "Excerpt: a step's body", "    "),
        fenced("toml", "[tool.pytest.ini_options]\n", "pyproject.toml"),
        fenced("python", "print('hello')\n"),
    )
    examples = collect_examples(docs)
    assert [example.block.name for example in examples] == [
        "how-to/orders.md:9 src/shop/orders.py",
        "how-to/orders.md:35 Excerpt: a step's body",
        "how-to/orders.md:43 (untitled)",
    ]
    assert examples[1].block.code == "self.status = 'x'\n"  # dedented out of the admonition
    files = [block.path for block in examples[2].files]
    assert files == ["src/shop/orders.py", "pyproject.toml"]  # the sh block is only shown


def test_fence_info_in_braces_gives_the_language_and_title() -> None:
    page = '~~~~{ .python title="src/app.py" linenums="1" }\nx = 1\n~~~~\n'
    (block,) = parse_blocks(page, "how-to/x.md")
    assert (block.language, block.title, block.path, block.code) == (
        "python",
        "src/app.py",
        "src/app.py",
        "x = 1\n",
    )


async def test_a_module_and_its_tests_pass_on_the_suites_server(
    docs: Path, tmp_path: Path, server: Server
) -> None:
    write_page(
        docs,
        "how-to/orders.md",
        fenced("python", ORDERS, "src/shop/orders.py"),
        fenced("python", CONFTEST, "tests/conftest.py"),
        fenced("python", PAID_TEST, "tests/test_orders.py"),
    )
    module, conftest, tests = collect_examples(docs)
    assert await run_example(module, server, tmp_path / "a") == PASSED
    assert await run_example(conftest, server, tmp_path / "c") == PASSED  # no test yet
    assert await run_example(tests, server, tmp_path / "b") == PASSED
    pyproject = (tmp_path / "b" / "pyproject.toml").read_text()
    assert 'duly_app = ["shop.orders"]' in pyproject  # the default: every module under src/


async def test_a_failing_block_names_its_page_and_line_and_shows_the_output(
    docs: Path, tmp_path: Path, server: Server
) -> None:
    write_page(
        docs,
        "how-to/broken.md",
        fenced("python", "def test_sums():\n    assert 1 + 1 == 3\n", "tests/test_sums.py"),
        fenced("python", "from shop import nowhere\n", "src/shop/app.py"),
    )
    failing_test, failing_import = collect_examples(docs)
    result = await run_example(failing_test, server, tmp_path / "a")
    assert result.status == "failed"
    assert result.message.startswith("how-to/broken.md:5 tests/test_sums.py: `")
    assert "assert (1 + 1) == 3" in result.message  # pytest's own report, from its stdout
    result = await run_example(failing_import, server, tmp_path / "b")
    assert result.status == "failed"
    assert result.message.startswith("how-to/broken.md:10 src/shop/app.py: `")
    assert "ImportError: cannot import name 'nowhere'" in result.message


async def test_an_excerpt_is_skipped_by_its_name_and_an_untitled_block_is_refused(
    docs: Path, tmp_path: Path, server: Server
) -> None:
    write_page(
        docs,
        "how-to/parts.md",
        fenced("python", "return wait_for(Signup.confirm)\n", "Excerpt: the step's return"),
        fenced("python", "x = 1\n"),
        fenced("python", "x = 1\n", "orders"),
    )
    excerpt, untitled, unnamed = collect_examples(docs)
    assert await run_example(excerpt, server, tmp_path / "a") == Outcome(
        "skipped", "Excerpt: the step's return"
    )
    refused = await run_example(untitled, server, tmp_path / "b")
    assert refused.status == "failed"
    assert refused.message.startswith("how-to/parts.md:9: a python block without a title")
    refused = await run_example(unnamed, server, tmp_path / "c")
    assert refused.status == "failed"
    assert 'title="orders" is neither a .py file' in refused.message
    assert not (tmp_path / "b").exists()  # refused before anything was written


async def test_a_script_runs_on_a_fresh_database_with_the_tables_of_src(
    docs: Path, tmp_path: Path, server: Server
) -> None:
    write_page(
        docs,
        "how-to/scripts.md",
        fenced("python", ORDERS, "src/shop/orders.py"),
        fenced("python", COUNT_SCRIPT, "scripts/count.py"),
    )
    _, script = collect_examples(docs)
    assert await run_example(script, server, tmp_path / "a") == PASSED


async def test_the_tutorial_is_one_project_from_the_scaffold_in_the_navs_order(
    docs: Path, tmp_path: Path, server: Server
) -> None:
    nav = "nav:\n  - tutorial/start.md\n  - Next: tutorial/next.md\n"
    (tmp_path / "mkdocs.yml").write_text(nav + "extra:\n  x: !!python/name:os.sep\n")
    check = "from shop.{m} import {n}\n\n\ndef test_it():\n    assert {n} == {v}\n"
    write_page(  # written first in the folder's order, but second in the nav's
        docs,
        "tutorial/next.md",
        fenced("python", "VALUE = 2\n", "src/shop/extra.py"),
        fenced("python", check.format(m="extra", n="VALUE", v=2), "tests/test_extra.py"),
    )
    write_page(
        docs,
        "tutorial/start.md",
        fenced("python", "VALUE = 1\n", "src/shop/extra.py"),
        fenced("python", check.format(m="workflows", n="CONFIRM_WITHIN.days", v=1), "t/x.py"),
    )
    examples = by_name(docs)
    assert list(examples) == [
        "tutorial/start.md:5 src/shop/extra.py",
        "tutorial/start.md:9 t/x.py",
        "tutorial/next.md:5 src/shop/extra.py",
        "tutorial/next.md:9 tests/test_extra.py",
    ]
    last = examples["tutorial/next.md:9 tests/test_extra.py"]
    assert await run_example(last, server, tmp_path / "a") == PASSED
    assert (tmp_path / "a" / "src" / "shop" / "workflows.py").is_file()  # duly init's
    assert (tmp_path / "a" / "src" / "shop" / "extra.py").read_text() == "VALUE = 2\n"
    first = examples["tutorial/start.md:5 src/shop/extra.py"]
    assert await run_example(first, server, tmp_path / "b") == PASSED
    assert (tmp_path / "b" / "src" / "shop" / "extra.py").read_text() == "VALUE = 1\n"
