"""`duly init DIR`: a new app of one's own, outside duly's repository, ready for `sam build`.

The scaffold's files are package data (functions/cli/scaffold/, `.tmpl` files whose
`{{name}}` placeholders are filled in); `src/requirements.txt` is written here, naming
duly's wheel (`--wheel`, copied into the app) until duly is on a package index.
"""

from __future__ import annotations

import argparse
import re
import shutil
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from engine import ConfigurationError
from functions.cli.common import Commands
from functions.cli.output import refused
from infra.schema.app_layout import check_package_name

TEMPLATE_SUFFIX = ".tmpl"
PACKAGE_FOLDER = "package"  # the scaffold's folder that becomes the app's package
RENAMED = {"gitignore": ".gitignore"}  # files a wheel would not carry under their own name
WHEELS = "wheels"  # where --wheel is copied, beside src/ (so outside the bundle)


def add_init(commands: Commands) -> None:
    """`duly init DIR` and its options."""
    init = commands.add_parser("init", help="scaffold a new app of your own in an empty folder")
    init.add_argument("directory", metavar="DIR", help="the new app's folder (new, or empty)")
    init.add_argument(
        "--package", help="the app's Python package (default: DIR's name, as an identifier)"
    )
    init.add_argument(
        "--wheel",
        type=Path,
        help="duly's wheel (python -m build), copied into the app and named by its "
        "requirements (default: duly from a package index)",
    )
    init.set_defaults(command=run_init)


def run_init(args: argparse.Namespace) -> int:
    """`duly init`: write the scaffold, or say why not and write nothing."""
    target = Path(args.directory)
    try:
        package = args.package or package_name_of(target)
        check_package_name(package)
        check_empty(target)
        wheel = check_wheel(args.wheel)
        write_scaffold(target, package, wheel)
    except ConfigurationError as exc:
        return refused(exc)
    print(f"duly: wrote a new app in {target}: its workflows are {package}.workflows.")
    print(f"duly: next: cd {target}, then read README.md (pytest, duly dev, sam build).")
    return 0


def package_name_of(target: Path) -> str:
    """An identifier from the folder's name: `my-app` becomes `my_app`."""
    name = re.sub(r"\W", "_", target.resolve().name.lower().replace("-", "_"))
    return name if name.isidentifier() else f"app_{name}"


def check_empty(target: Path) -> None:
    """ConfigurationError if `target` is a file, or a folder with anything in it."""
    if target.exists() and not target.is_dir():
        raise ConfigurationError(f"{target} is a file: duly init makes a new folder.")
    if target.is_dir() and any(target.iterdir()):
        raise ConfigurationError(
            f"{target} is not empty: duly init writes a new app into a new or empty folder only, "
            "so that it overwrites nothing."
        )


def check_wheel(wheel: Path | None) -> Path | None:
    """The wheel given, checked to be one of duly's."""
    if wheel is None:
        return None
    if not wheel.is_file() or not wheel.name.startswith("duly-") or wheel.suffix != ".whl":
        raise ConfigurationError(
            f"--wheel {wheel} is not a wheel of duly: build one with `python -m build --wheel` "
            "in duly's repository (it writes dist/duly-VERSION-py3-none-any.whl)."
        )
    return wheel


def write_scaffold(target: Path, package: str, wheel: Path | None) -> None:
    """Every file of the scaffold into `target`, with the app's names filled in."""
    if wheel is not None:
        (target / WHEELS).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, target / WHEELS / wheel.name)
        requirement = f"./{WHEELS}/{wheel.name}"  # pip reads it from where sam build runs
        source = f"the wheel in {WHEELS}/ (duly is not on a package index yet)"
        install = f"./{WHEELS}/{wheel.name}"
    else:
        requirement = f"duly=={own_version()}"
        source = "a package index"
        install = "duly"
    values = {"package": package, "duly_source": source, "duly_install": install}
    copy_tree(files("functions.cli").joinpath("scaffold"), target, package, values)
    (target / "src" / "requirements.txt").write_text(requirements_text(requirement))


def requirements_text(requirement: str) -> str:
    """src/requirements.txt: what sam build installs beside the app's code."""
    return (
        "# What the Lambda bundle holds beside the app's code (sam build installs it).\n"
        "# Until duly is on a package index, its wheel comes from a path: build it with\n"
        "# `python -m build --wheel` in duly's repository and run `duly init --wheel`.\n"
        f"{requirement}\n"
    )


def copy_tree(source: Traversable, target: Path, package: str, values: dict[str, str]) -> None:
    """The templates under `source` into `target`, recursively."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir(), key=lambda e: e.name):
        name = package if entry.name == PACKAGE_FOLDER else entry.name
        if entry.is_dir():
            if name != "__pycache__":
                copy_tree(entry, target / name, package, values)
        elif name.endswith(TEMPLATE_SUFFIX):
            name = name.removesuffix(TEMPLATE_SUFFIX)
            (target / RENAMED.get(name, name)).write_text(fill(entry.read_text(), values))


def fill(text: str, values: dict[str, str]) -> str:
    """`text` with each `{{name}}` replaced by its value."""
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    return text


def own_version() -> str:
    """duly's installed version (0.1.0 when it is not installed)."""
    try:
        return version("duly")
    except PackageNotFoundError:
        return "0.1.0"
