"""engine.base.settings: every DULY_* variable declared once, read only there, shown in the docs.

- every DULY_* name the project mentions is declared, and every declared one is
  listed in SETTINGS: test_every_variable_the_project_names_is_declared
- no module of engine/, functions/ or infra/ but engine/base/settings.py reads one from
  the environment: test_only_engine_settings_reads_duly_variables
- docs/reference/settings.md's table is the registry's: test_the_settings_page_is_the_registry
- a bad value is a ConfigurationError naming the variable, and a secret's value is
  never repeated: test_a_bad_value_is_refused_naming_the_variable,
  test_a_secret_is_never_repeated
- unset or empty is the default: test_unset_or_empty_is_the_default
- a key of one letter repeated (or a few) is refused, unshown, with a sentence saying how
  to make a random one: test_a_repetitive_key_is_refused_without_being_shown
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from engine import ConfigurationError
from engine.base import settings as variables
from engine.base.settings import SETTINGS
from functions.identity.signatures import parse_secrets
from tests.helpers import REPO_ROOT

READ_CHECKED = ("engine", "functions", "infra")  # no DULY_* read outside engine/base/settings.py
MENTIONS_CHECKED = ("engine", "functions", "infra", "bench", "tests", "docs", "README.md")
# Names that look like variables but are not: prefixes in prose and filters, a constant.
NOT_VARIABLES = frozenset({"DULY_RETAIN_", "DULY_PRUNE_", "DULY_TABLES", "DULY_PACKAGES"})
ENVIRONMENT_NAMES = frozenset({"environ", "env"})
SETTINGS_PAGE = REPO_ROOT / "docs" / "reference" / "settings.md"


def python_files(*tops: str) -> list[Path]:
    """The .py files under these top-level folders of the repository."""
    return sorted(path for top in tops for path in (REPO_ROOT / top).rglob("*.py"))


def test_every_variable_the_project_names_is_declared() -> None:
    mentioned: set[str] = set()
    for top in MENTIONS_CHECKED:
        root = REPO_ROOT / top
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in paths:
            if path.suffix in {".py", ".md", ".yaml", ".toml", ".html", ".txt"}:
                mentioned |= set(re.findall(r"DULY_[A-Z0-9_]+", path.read_text()))
    declared = {setting.name for setting in SETTINGS}
    assert sorted(mentioned - NOT_VARIABLES - declared) == []
    assert sorted(declared - mentioned) == []  # nothing declared that nothing reads
    module_settings = [v for v in vars(variables).values() if isinstance(v, variables.Setting)]
    assert sorted(s.name for s in module_settings) == sorted(declared)
    assert len(SETTINGS) == len(declared), "a variable is declared twice"


def duly_reads(path: Path) -> list[tuple[int, str]]:
    """Where a module reads a DULY_* variable from the environment: (line, variable).

    A read is `.get`, `.pop`, `.setdefault`, a subscript or an `in` of a DULY_* name (or
    of a module constant holding one) on `os.environ`, on a name `environ`/`env`, or on
    anything in a module that touches `os.environ`; and `os.getenv` of one.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def variable(node: ast.expr) -> str | None:
        value = constants.get(node.id) if isinstance(node, ast.Name) else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
        return value if value is not None and value.startswith("DULY_") else None

    def os_environ(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    touches_environ = any(os_environ(node) for node in ast.walk(tree) if isinstance(node, ast.expr))

    def environment(node: ast.expr) -> bool:
        named = isinstance(node, ast.Name) and node.id in ENVIRONMENT_NAMES
        return touches_environ or os_environ(node) or named

    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            getenv = node.func.attr == "getenv"
            lookup = node.func.attr in {"get", "pop", "setdefault"}
            if getenv or (lookup and environment(node.func.value)):
                name = variable(node.args[0])
        elif isinstance(node, ast.Subscript) and environment(node.value):
            name = variable(node.slice)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and environment(node.comparators[0])
        ):
            name = variable(node.left)
        if name is not None:
            found.append((node.lineno, name))
    return sorted(found)


def reads_outside_settings() -> dict[str, list[tuple[int, str]]]:
    """Each module but engine/base/settings.py that reads a DULY_* variable, with its reads."""
    found = {}
    for path in python_files(*READ_CHECKED):
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative != "engine/base/settings.py" and (reads := duly_reads(path)):
            found[relative] = reads
    return found


def test_only_engine_settings_reads_duly_variables() -> None:
    found = reads_outside_settings()
    assert not found, "DULY_* read outside engine/base/settings.py:\n" + "\n".join(
        f"  {path}:{line}: {name}" for path, reads in found.items() for line, name in reads
    )


def test_the_detector_finds_each_way_of_reading(tmp_path: Path) -> None:
    prefix = "DULY" + "_"  # spelled apart, so the names below are not taken for variables
    module = tmp_path / "reader.py"
    module.write_text(
        "import os\n"
        f'NAME = "{prefix}A"\n'
        "os.environ.get(NAME)\n"
        f'os.getenv("{prefix}B")\n'
        f'x = os.environ["{prefix}C"]\n'
        f'y = "{prefix}D" in os.environ\n'
        'z = {}.get("OTHER")\n'
    )
    found = duly_reads(module)
    assert found == [(3, prefix + "A"), (4, prefix + "B"), (5, prefix + "C"), (6, prefix + "D")]


def test_the_settings_page_is_the_registry() -> None:
    page = SETTINGS_PAGE.read_text()
    table = [line for line in page.splitlines() if line.startswith("|")]
    assert "\n".join(table) == variables.markdown_table(), "run python docs/reference.py"
    assert all(f"| `{setting.name}` |" in page for setting in SETTINGS)


BAD_VALUES = [
    (variables.GC_TUNING, "maybe"),
    (variables.STRANDED_AFTER_SECONDS, "0"),
    (variables.STRANDED_AFTER_SECONDS, "soon"),
    (variables.PORT, "eighty"),
    (variables.PORT, "70000"),
    (variables.ASYNC, "sometimes"),
    (variables.DEAD_LETTER_ENABLED, "2"),
    (variables.SIGNAL_BRIDGE, "yes please"),
    (variables.RETAIN_ATTEMPTS_DAYS, "thirty"),
    (variables.RETAIN_EVENTS_DAYS, "0"),
    (variables.RETAIN_EXECUTIONS_DAYS, "36501"),
    (variables.PRUNE_BATCH_SIZE, "1e6"),
    (variables.PRUNE_PAUSE_MS, "-1"),
    (variables.PRUNE_ON_DRAIN, "later"),
    (variables.PRUNE_DRAIN_BATCHES, "0"),
    (variables.MAX_BODY_BYTES, "0"),
    (variables.MAX_BODY_BYTES, "1MB"),
    (variables.MAX_WAKES, "2.5"),
    (variables.WAKE_MARGIN_SECONDS, "nan"),
    (variables.WAKE_MARGIN_SECONDS, "0.5"),
    (variables.CHAOS_KEEP, "keep"),
]


@pytest.mark.parametrize(
    ("setting", "value"), BAD_VALUES, ids=[f"{s.name}={v}" for s, v in BAD_VALUES]
)
def test_a_bad_value_is_refused_naming_the_variable(
    setting: variables.Setting[object], value: str
) -> None:
    with pytest.raises(ConfigurationError, match=setting.name) as refused:
        setting.read({setting.name: value})
    assert repr(value) in str(refused.value) or value in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_a_secret_is_never_repeated() -> None:
    secret = dataclasses.replace(variables.MAX_WAKES, secret=True)
    with pytest.raises(ConfigurationError, match="DULY_MAX_WAKES") as refused:
        secret.read({"DULY_MAX_WAKES": "hunter2"})
    assert "hunter2" not in str(refused.value)
    spaced = " a key with spaces around "
    assert variables.API_TOKEN.read({"DULY_API_TOKEN": spaced}) == spaced  # as written


def test_a_short_key_is_refused_without_being_shown() -> None:
    for setting in (variables.API_TOKEN, variables.WEBHOOK_SECRET):
        with pytest.raises(
            ConfigurationError, match=f"{setting.name} must be at least 16"
        ) as refused:
            setting.read({setting.name: "a"})
        assert "'a'" not in str(refused.value)
        good = "a-key-of-sixteen-or-more"
        assert setting.read({setting.name: good}) == good


def test_a_repetitive_key_is_refused_without_being_shown() -> None:
    for setting in (variables.API_TOKEN, variables.WEBHOOK_SECRET, variables.METRICS_TOKEN):
        for weak in ("k" * 16, "ab" * 12, "abc" * 6):
            with pytest.raises(ConfigurationError, match="repeats too few characters") as refused:
                setting.read({setting.name: weak})
            assert weak not in str(refused.value) and "token_urlsafe" in str(refused.value)
    secrets_list = json.dumps([{"name": "s", "secret": "x" * 40, "routes": ["POST /events"]}])
    with pytest.raises(ConfigurationError, match=r"\(s\)\.secret repeats too few"):
        parse_secrets(secrets_list)


def test_unset_or_empty_is_the_default() -> None:
    for setting in SETTINGS:
        assert setting.read({}) == setting.default
        if not setting.exact:  # a key is read as written: blanks are its text, too short
            assert setting.read({setting.name: "  "}) == setting.default


def test_values_parse_as_their_kind() -> None:
    assert variables.MODE.read({"DULY_MODE": " Production "}) == "production"
    assert variables.MODE.read({"DULY_MODE": "staging"}) == "local"
    assert variables.RETAIN_EVENTS_DAYS.read({"DULY_RETAIN_EVENTS_DAYS": "Never"}) is None
    assert variables.PORT.read({"DULY_PORT": " 9000 "}) == 9000
    assert variables.WAKE_MARGIN_SECONDS.read({"DULY_WAKE_MARGIN_SECONDS": "2.5"}) == 2.5
    assert variables.GC_TUNING.read({"DULY_GC_TUNING": "OFF"}) is False
    assert variables.OUTBOX_BATCH_SIZE.read({"DULY_OUTBOX_BATCH_SIZE": "-3"}) == 1  # raised
