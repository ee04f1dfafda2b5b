"""Named API keys: each a name, its roles and groups, and the SHA-256 of the key, never the key.

`DULY_API_KEYS` lists them as JSON (`duly keys new NAME --role operator`
prints a key and its entry). A key is `duly_` and 43 random characters, so
one SHA-256 is enough to store it: there is nothing to guess word by word.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from engine import ConfigurationError, settings as variables
from functions.identity.principal import RESERVED_IDS, Principal, Role, Via, reserved
from functions.identity.roles import MAX_NAME, roles_of

KEY_PREFIX = "duly_"
DIGEST = re.compile(r"[0-9a-f]{64}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")


def digest_of(key: str) -> str:
    """The hex SHA-256 of a key: what DULY_API_KEYS stores."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh key: `duly_` and 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ApiKey:
    """One named key: who it is, what it may do, and its digest."""

    name: str
    roles: frozenset[Role]
    groups: frozenset[str]
    sha256: str

    def entry(self) -> dict[str, object]:
        """The key as DULY_API_KEYS lists it."""
        return {
            "name": self.name,
            "roles": sorted(self.roles),
            "groups": sorted(self.groups),
            "sha256": self.sha256,
        }

    def principal(self) -> Principal:
        """The principal a request with this key acts as."""
        return Principal(id=self.name, roles=self.roles, via=Via.API_KEY, groups=self.groups)


@dataclass(frozen=True)
class KeyRing:
    """The configured keys, found by the digest of what a caller presents."""

    keys: tuple[ApiKey, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KeyRing:
        """DULY_API_KEYS, parsed and checked; empty when unset."""
        raw = variables.API_KEYS.read(environ)
        return cls(parse_keys(raw)) if raw else cls()

    def find(self, presented: str) -> ApiKey | None:
        """The key whose digest is the presented key's; None for any other text."""
        if not presented.startswith(KEY_PREFIX):
            return None
        digest = digest_of(presented)
        found = None
        for key in self.keys:  # every digest compared, in constant time each
            if hmac.compare_digest(key.sha256, digest):
                found = key
        return found


def parse_keys(raw: str) -> tuple[ApiKey, ...]:
    """DULY_API_KEYS' JSON list as keys; ConfigurationError saying what is wrong."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigurationError("DULY_API_KEYS must be a JSON list of keys.") from None
    if not isinstance(document, list):
        raise ConfigurationError("DULY_API_KEYS must be a JSON list of keys.")
    keys = [_key_of(entry, index) for index, entry in enumerate(document)]
    names = [key.name for key in keys]
    if len(set(names)) != len(names):
        raise ConfigurationError("DULY_API_KEYS names each key once.")
    return tuple(keys)


def _key_of(entry: object, index: int) -> ApiKey:
    where = f"DULY_API_KEYS[{index}]"
    if not isinstance(entry, dict) or set(entry) - {"name", "roles", "groups", "sha256"}:
        raise ConfigurationError(f"{where} must be an object of name, roles, groups and sha256.")
    name, digest, groups = entry.get("name"), entry.get("sha256"), entry.get("groups", [])
    if not isinstance(name, str) or len(name) > MAX_NAME or not NAME.fullmatch(name):
        raise ConfigurationError(f"{where}.name must be letters, digits and ._@+- only.")
    if reserved(name):
        raise ConfigurationError(
            f"{where}.name {name!r} is a name duly's own principals act as "
            f"({', '.join(sorted(RESERVED_IDS))}): name the key after its holder."
        )
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise ConfigurationError(f"{where}.sha256 must be 64 lowercase hex digits.")
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        raise ConfigurationError(f"{where}.groups must be a list of group names.")
    roles = roles_of(entry.get("roles"), f"{where}.roles")
    return ApiKey(name=name, roles=roles, groups=frozenset(groups), sha256=digest)
