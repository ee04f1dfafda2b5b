"""docs/reference/python/*.md: the docstrings of `engine.__all__`, a page per group of api.md.

`engine` exports its names lazily (`engine.exports`), so the pages point
mkdocstrings at each name's own module: the object's `__module__` when it is
defined under that name there, else the module `engine.exports` lists it in.
"""

from __future__ import annotations

import re
from pathlib import Path

GROUP = re.compile(r"^## (?P<heading>.+)$", re.MULTILINE)
ENTRY = re.compile(r"^- `(?P<name>[A-Za-z_][A-Za-z0-9_]*)`: ", re.MULTILINE)
MODULE_OPTIONS = "    options:\n      members: false"  # a namespace: its docstring, not its names


def groups(api_page: str) -> list[tuple[str, list[str]]]:
    """docs/api.md's groups: each heading with the names listed under it."""
    found = []
    headings = list(GROUP.finditer(api_page))
    for index, heading in enumerate(headings):
        end = headings[index + 1].start() if index + 1 < len(headings) else len(api_page)
        names = ENTRY.findall(api_page, heading.end(), end)
        if names:
            found.append((heading["heading"].strip(), names))
    return found


def real_path(name: str) -> str:
    """Where griffe finds `engine.<name>`: its defining module's dotted path and the name."""
    import engine
    from engine.exports import LAZY_MODULES, SUBMODULES

    if name in SUBMODULES:
        return SUBMODULES[name]
    value = getattr(engine, name)
    module = getattr(value, "__module__", None)
    defined_there = getattr(value, "__qualname__", None) == name
    if isinstance(module, str) and module.startswith("engine.") and defined_there:
        return f"{module}.{name}"
    listed = [module for module, names in LAZY_MODULES.items() if name in names.split()]
    return f"{listed[0]}.{name}"


def slug(heading: str) -> str:
    """A group's file name: the first word of its heading but `the`, lower case."""
    words: list[str] = re.findall(r"[a-z0-9]+", heading.lower())
    return next(word for word in words if word != "the")


def python_pages(docs: Path, generated: str) -> dict[Path, str]:
    """One page per group of docs/api.md, each name a `::: module.name` block."""
    from engine.exports import SUBMODULES

    written = {}
    for heading, names in groups((docs / "api.md").read_text()):
        lines = [
            f"# {heading}",
            "",
            generated,
            "",
            "The docstrings of this group of [the public API](../../api.md).",
            f"Import each name from `engine`, as in `from engine import {names[0]}`.",
            "",
        ]
        for name in sorted(names, key=str.lower):
            lines += [f"::: {real_path(name)}"]
            if name in SUBMODULES:
                lines += [MODULE_OPTIONS]
            lines += [""]
        written[docs / "reference" / "python" / f"{slug(heading)}.md"] = "\n".join(lines)
    return written
