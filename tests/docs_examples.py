"""The runner of the docs' examples: the fenced blocks of the tutorial and how-to pages, run.

The convention (docs/architecture.md, "The documentation site"): every ```python block
has a title, a path of the page's small project (`title="src/shop/orders.py"`) or
`title="Excerpt: what it shows"` (skipped by that name). Blocks of other languages titled
with a path are written as files; untitled ones are only shown. Each how-to page is a
project of its own, starting from a default pyproject.toml; the tutorial's pages are one
project, in the nav's order, starting from what `duly init shop` writes. An example's test
writes its project's file blocks up to its own, then runs its own block: under `src/` it
is imported in a fresh interpreter, under `tests/` pytest runs it on the suite's
PostgreSQL, anywhere else `python PATH` runs it with DULY_DATABASE_URL naming a fresh
database that has the tables of the project's `src/` modules.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import pytest
import yaml

import engine
from functions.cli.init import write_scaffold
from infra.testing.pytest_plugin import Server, fresh_database

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs"
TUTORIAL, HOW_TO = "tutorial", "how-to"  # the folders of docs/ whose examples run
TUTORIAL_PACKAGE = "shop"  # the tutorial begins with `duly init shop`
PYTHON = ("python", "py", "python3")
EXCERPT = "Excerpt:"  # a title that starts so marks a fragment, shown and skipped
RUN_TIMEOUT = 90  # seconds for one example's subprocess
SHOWN_OUTPUT = 6000  # characters of a failed subprocess's stdout and stderr, each, shown
# Where this process imports duly from, so the examples run the same duly as the suite.
SOURCE_ROOT = Path(engine.__file__).resolve().parents[1]

OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
ATTRIBUTE = re.compile(r"""(\w+)=(?:"([^"]*)"|'([^']*)')""")

# The tables of the project's src/ modules, created by duly's pytest plugin's own helpers
# in a subprocess (the modules change from one example to the next: never imported here).
CREATE_TABLES = """\
import asyncio, sys
from infra.testing.pytest_plugin import Database, app_metadata

async def create() -> None:
    name, url, conninfo, *modules = sys.argv[1:]
    database = Database(name, url, conninfo)
    await database.create(*app_metadata(modules))
    for engine in database.engines:
        await engine.dispose()

asyncio.run(create())
"""
# pytest with only the plugins the examples use: the venv's others (playwright, schemathesis,
# hypothesis, ...) would cost each run nearly 2 s of imports.
PYTEST = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin")
PYTEST_PLUGINS = ("-p", "infra.testing.pytest_plugin")  # duly's, as its entry point loads it
NO_TESTS_COLLECTED = 5  # pytest's exit status when it found no test
IMPORT_MODULE = "import importlib, sys; importlib.import_module(sys.argv[1])"


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, title and code."""

    page: str  # relative to the docs root: "how-to/events.md"
    line: int  # of its opening fence, from 1
    language: str
    title: str | None
    code: str

    @property
    def is_python(self) -> bool:
        return self.language.lower() in PYTHON

    @property
    def is_excerpt(self) -> bool:
        return self.title is not None and self.title.startswith(EXCERPT)

    @property
    def path(self) -> str | None:
        """The project file the block is, when its title is a relative path."""
        if self.title is None or self.is_excerpt or not is_relative_path(self.title):
            return None
        return self.title

    @property
    def name(self) -> str:
        """The test id: `how-to/events.md:3 src/shop/orders.py`."""
        return f"{self.page}:{self.line} {self.title or '(untitled)'}"


@dataclass(frozen=True)
class Example:
    """A Python block, and the file blocks of its project up to and including it."""

    block: Block
    files: tuple[Block, ...]
    tutorial: bool  # the project starts from `duly init shop`, else from a default pyproject


@dataclass(frozen=True)
class Outcome:
    """What running an example came to, and the message a skip or a failure shows."""

    status: Literal["passed", "skipped", "failed"]
    message: str = ""


def is_relative_path(title: str) -> bool:
    """A title that names a file inside the project: no spaces, not absolute, no `..`."""
    path = PurePosixPath(title)
    return (
        not re.search(r"\s", title)
        and not path.is_absolute()
        and ".." not in path.parts
        and ("/" in title or "." in title)
    )


def parse_blocks(text: str, page: str) -> Iterator[Block]:
    """The fenced blocks of a Markdown page, in order (indented ones too, dedented)."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = OPENING.match(lines[index])
        index += 1
        if opening is None:
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        start, body = index, []
        while index < len(lines) and not closing.match(lines[index]):
            line = lines[index]
            body.append(line[min(indent, len(line) - len(line.lstrip())) :])
            index += 1
        index += 1  # past the closing fence (or the page's end)
        language, attributes = parse_info(opening["info"])
        code = "\n".join(body) + "\n" if body else ""
        yield Block(page, start, language, attributes.get("title"), code)


def parse_info(info: str) -> tuple[str, dict[str, str]]:
    """A fence's language and attributes: `python title="x"` or `{ .python title="x" }`."""
    info = info.strip()
    attributes = {key: double or single for key, double, single in ATTRIBUTE.findall(info)}
    if info.startswith("{"):
        classes = re.findall(r"(?:^|\s)\.([\w+-]+)", info.strip("{} "))
        return (classes[0] if classes else ""), attributes
    words = re.split(r"[\s{]", info, maxsplit=1)
    return words[0], attributes


def tutorial_pages(docs: Path) -> list[Path]:
    """The tutorial's pages in the nav's order (mkdocs.yml beside the docs), then the rest."""
    found = sorted((docs / TUTORIAL).glob("*.md"))
    listed = [docs / page for page in nav_pages(docs.parent / "mkdocs.yml")]
    ordered = [page for page in listed if page in found]
    return ordered + [page for page in found if page not in ordered]


def nav_pages(config: Path) -> list[str]:
    """The pages mkdocs.yml's nav lists, in order (none when there is no mkdocs.yml)."""
    if not config.is_file():
        return []
    loaded = yaml.load(config.read_text(), Loader=TolerantLoader)  # a SafeLoader
    pages: list[str] = []

    def walk(entry: Any) -> None:
        if isinstance(entry, str) and entry.endswith(".md"):
            pages.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)

    walk((loaded or {}).get("nav", []))
    return pages


class TolerantLoader(yaml.SafeLoader):
    """YAML's safe loader that reads MkDocs's `!!python/name:` tags as nothing."""


TolerantLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
TolerantLoader.add_multi_constructor("!", lambda *_: None)


def collect_examples(docs: Path = DOCS) -> list[Example]:
    """Every Python block of the tutorial and how-to pages under `docs`, as an example."""
    examples = project_examples(docs, tutorial_pages(docs), tutorial=True)
    for page in sorted((docs / HOW_TO).glob("*.md")):
        examples += project_examples(docs, [page], tutorial=False)
    return examples


def project_examples(docs: Path, pages: list[Path], *, tutorial: bool) -> list[Example]:
    """The examples of one project: its pages' Python blocks, each with the files before it."""
    examples: list[Example] = []
    files: list[Block] = []
    for page in pages:
        for block in parse_blocks(page.read_text(), page.relative_to(docs).as_posix()):
            if block.path is not None:
                files.append(block)
            if block.is_python:
                examples.append(Example(block, tuple(files), tutorial))
    return examples


async def run_example(example: Example, server: Server, folder: Path) -> Outcome:
    """Write the example's project into `folder` and run its block as the convention says."""
    block = example.block
    if block.is_excerpt:
        return Outcome("skipped", block.title or EXCERPT)
    refusal = refusal_of(block)
    if refusal:
        return Outcome("failed", f"{block.page}:{block.line}: {refusal}")
    path = write_project(example, folder)
    if path.parts[0] == "src":
        command = [sys.executable, "-c", IMPORT_MODULE, module_name(path)]
        return outcome(block, command, f"`import {module_name(path)}`", folder, {})
    if path.parts[0] == "tests":
        # A conftest.py or a helper is run by the tests written so far (maybe none yet).
        target = path if path.name.startswith("test_") else PurePosixPath("tests")
        command = [sys.executable, *PYTEST, *PYTEST_PLUGINS, str(target)]
        database_url = {
            "DULY_TEST_DATABASE_URL": server.base_url,  # the suite's server: none of its own
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
        passing = (0,) if target == path else (0, NO_TESTS_COLLECTED)
        return outcome(block, command, f"`pytest {target}`", folder, database_url, passing)
    async with fresh_database(server) as database:
        modules = src_modules(folder)
        if modules:
            create = [sys.executable, "-c", CREATE_TABLES, database.name, database.url]
            create += [database.conninfo, *modules]
            creating = f"creating the tables of {', '.join(modules)}"
            created = outcome(block, create, creating, folder, {})
            if created.status == "failed":
                return created
        command = [sys.executable, str(path)]
        url = {"DULY_DATABASE_URL": database.conninfo}
        return outcome(block, command, f"`python {path}`", folder, url)


def refusal_of(block: Block) -> str | None:
    """Why a Python block cannot run: no title, or a title neither a .py path nor an excerpt."""
    if block.title is None:
        return (
            'a python block without a title: give it title="PATH" (a file of the page\'s '
            'project, e.g. title="src/shop/orders.py") or title="Excerpt: what it shows".'
        )
    if block.is_excerpt and not block.title.removeprefix(EXCERPT).strip():
        return f'title="{EXCERPT}" says nothing: say what the excerpt shows.'
    if block.path is None or not block.path.endswith(".py"):
        return (
            f'title="{block.title}" is neither a .py file of the project (a relative path) '
            f'nor "{EXCERPT} what it shows".'
        )
    return None


def write_project(example: Example, folder: Path) -> PurePosixPath:
    """The project's start, then its file blocks in order; the path of the example's file."""
    if example.tutorial:
        write_scaffold(folder, TUTORIAL_PACKAGE, None)
    folder.mkdir(parents=True, exist_ok=True)
    for block in example.files:
        assert block.path is not None
        (folder / block.path).parent.mkdir(parents=True, exist_ok=True)
        (folder / block.path).write_text(block.code)
    written = {block.path for block in example.files}
    if not example.tutorial and "pyproject.toml" not in written:
        modules = [module_name(PurePosixPath(b.path)) for b in example.files if is_module(b)]
        (folder / "pyproject.toml").write_text(default_pyproject(list(dict.fromkeys(modules))))
    return PurePosixPath(str(example.block.path))


def is_module(block: Block) -> bool:
    """A file block that is a module of the page's src/ (a package's __init__ aside)."""
    path = PurePosixPath(str(block.path))
    return path.parts[0] == "src" and path.suffix == ".py" and path.name != "__init__.py"


def default_pyproject(modules: list[str]) -> str:
    """A how-to page's pyproject.toml unless it writes its own: pytest's settings."""
    lines = [
        "[tool.pytest.ini_options]",
        'pythonpath = ["src"]',
        'asyncio_mode = "auto"',
        'asyncio_default_fixture_loop_scope = "function"',
    ]
    if modules:
        lines.append("duly_app = [" + ", ".join(f'"{m}"' for m in modules) + "]")
    return "\n".join(lines) + "\n"


def module_name(path: PurePosixPath) -> str:
    """`src/shop/orders.py` -> `shop.orders`; `src/shop/__init__.py` -> `shop`."""
    parts = list(path.relative_to("src").with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def src_modules(folder: Path) -> list[str]:
    """The dotted names of the modules under the project's src/ (packages' __init__ aside)."""
    return sorted(
        module_name(PurePosixPath(path.relative_to(folder).as_posix()))
        for path in (folder / "src").rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    )


def outcome(
    block: Block,
    command: list[str],
    shown: str,
    folder: Path,
    extra: dict[str, str],
    passing: tuple[int, ...] = (0,),
) -> Outcome:
    """Run `command` (`shown` says what it does) in the project; a failure names the block
    and shows the output."""
    try:
        done = subprocess.run(
            command,
            cwd=folder,
            env=child_env(extra),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return Outcome("failed", f"{block.name}: {shown} ran over {RUN_TIMEOUT} s in {folder}")
    if done.returncode in passing:
        return Outcome("passed")
    return Outcome(
        "failed",
        f"{block.name}: {shown} exited {done.returncode} in {folder}\n"
        f"--- stdout\n{done.stdout[-SHOWN_OUTPUT:]}\n--- stderr\n{done.stderr[-SHOWN_OUTPUT:]}",
    )


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without duly's or pytest's settings; src/ and duly importable."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DULY_", "PYTEST_")) and name != "PYTHONPATH"
    }
    env["PYTHONPATH"] = os.pathsep.join(["src", str(SOURCE_ROOT)])
    return {**env, **extra}


async def assert_example_runs(example: Example, server: Server, folder: Path) -> None:
    """Pass, skip (an excerpt, by its name) or fail with the block's page, line and output."""
    result = await run_example(example, server, folder)
    if result.status == "skipped":
        pytest.skip(result.message)
    if result.status == "failed":
        pytest.fail(result.message, pytrace=False)
