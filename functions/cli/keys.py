"""`duly keys new NAME --role R`: a named API key, and the DULY_API_KEYS entry that takes it.

The key is printed once and stored nowhere; the entry holds only its
SHA-256. Add the entry to the list in DULY_API_KEYS (with any entries
already there) and give the key to its holder.
"""

from __future__ import annotations

import argparse
import json

from engine import ConfigurationError
from functions.cli.common import Commands
from functions.cli.output import refused
from functions.identity.keys import NAME, ApiKey, digest_of, new_key, parse_keys
from functions.identity.principal import role_of


def run_new_key(args: argparse.Namespace) -> int:
    """`duly keys new`: print a fresh key and its DULY_API_KEYS entry."""
    try:
        key, entry = new_entry(args.name, args.role, args.group)
    except ConfigurationError as exc:
        return refused(exc)
    print(f"key (shown once, give it to {args.name}): {key}")
    print(f"DULY_API_KEYS entry: {json.dumps(entry)}")
    return 0


def new_entry(name: str, roles: list[str], groups: list[str]) -> tuple[str, dict[str, object]]:
    """A fresh key and its entry, read back as DULY_API_KEYS reads it; ConfigurationError."""
    if not NAME.fullmatch(name):
        raise ConfigurationError("A key's name is letters, digits and ._@+- only.")
    try:
        held = frozenset(role_of(word) for word in roles)
    except ValueError as wrong:
        raise ConfigurationError(str(wrong)) from None
    key = new_key()
    entry = ApiKey(name, held, frozenset(groups), digest_of(key)).entry()
    parse_keys(json.dumps([entry]))
    return key, entry


def add_keys(commands: Commands) -> None:
    """`duly keys new` and its options."""
    keys = commands.add_parser("keys", help="named API keys with roles (DULY_API_KEYS)")
    actions = keys.add_subparsers(title="actions", required=True, metavar="ACTION")
    new = actions.add_parser("new", help="print a new key and the entry DULY_API_KEYS takes")
    new.add_argument("name", help="who holds the key: the audit trail records this name")
    new.add_argument(
        "--role",
        action="append",
        required=True,
        help="viewer, operator, designer or admin (repeat for several)",
    )
    new.add_argument(
        "--group", action="append", default=[], help="a group the holder is in (graph assignees)"
    )
    new.set_defaults(command=run_new_key)
