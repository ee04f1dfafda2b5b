"""`duly keys new`: a key printed once, and the DULY_API_KEYS entry that takes it.

- the printed entry, read as DULY_API_KEYS reads it, finds the printed key as its holder, with
  its roles and groups, and holds only the key's SHA-256:
  test_a_new_key_and_its_entry_name_the_same_holder
- a role that does not exist or a name with spaces: exit 2, a sentence, no key printed:
  test_a_bad_role_or_name_prints_no_key
"""

from __future__ import annotations

import json
from pathlib import Path

from functions.identity.keys import KeyRing, digest_of, parse_keys
from functions.identity.principal import Role
from tests.helpers import dev_env, run_duly


def test_a_new_key_and_its_entry_name_the_same_holder(tmp_path: Path) -> None:
    done = run_duly(
        "keys", "new", "mia", "--role", "operator", "--group", "finance",
        cwd=tmp_path, env=dev_env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    key_line, entry_line = done.stdout.splitlines()
    key = key_line.rsplit(" ", 1)[-1]
    entry = json.loads(entry_line.removeprefix("DULY_API_KEYS entry: "))
    assert key.startswith("duly_") and key not in entry_line
    assert entry["sha256"] == digest_of(key)
    found = KeyRing(parse_keys(json.dumps([entry]))).find(key)
    assert found is not None
    assert (found.name, found.roles, found.groups) == (
        "mia",
        frozenset({Role.OPERATOR}),
        frozenset({"finance"}),
    )


def test_a_bad_role_or_name_prints_no_key(tmp_path: Path) -> None:
    for args in (("mia", "--role", "boss"), ("mia smith", "--role", "viewer")):
        done = run_duly("keys", "new", *args, cwd=tmp_path, env=dev_env(tmp_path))
        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr.startswith("duly: ")
