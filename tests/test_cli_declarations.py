"""Every `duly` command is declared one way: by its module's `add_*`, beside its handler.

`functions/cli/parser.py` only gathers the modules' declarations; every
subcommand (and every action of a group) answers `--help` with exit 0.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.cli import build_parser
from functions.cli.parser import COMMAND_GROUPS

PARSER = Path(__file__).resolve().parent.parent / "functions" / "cli" / "parser.py"
DECLARING = {"add_argument", "add_parser", "add_argument_group", "add_mutually_exclusive_group"}


def subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command path below `parser`: ("runs",), ("bulk", "retry"), ..."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from subcommands(sub, (*path, name))


COMMANDS = sorted(subcommands(build_parser()))


def test_every_command_is_found() -> None:
    top = {path[0] for path in COMMANDS}
    assert {"dev", "db-url", "status", "runs", "show", "bulk", "keys", "version"} <= top
    assert ("bulk", "replay") in COMMANDS and ("keys", "new") in COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_subcommand_answers_help_with_exit_0(command: tuple[str, ...]) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    assert out.getvalue().startswith(f"usage: duly {' '.join(command)}")


def test_the_parser_module_declares_no_command_or_argument_itself() -> None:
    """parser.py calls no `add_argument` or `add_parser`: each command module declares its own."""
    called = {
        node.func.attr
        for node in ast.walk(ast.parse(PARSER.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert called & DECLARING == set()


def test_each_group_is_declared_by_its_own_module() -> None:
    """An `add_*` lives in the module of the commands it declares, never in parser.py."""
    modules = {add.__module__ for add in COMMAND_GROUPS}
    assert "functions.cli.parser" not in modules
    assert all(add.__name__.startswith("add_") for add in COMMAND_GROUPS)
