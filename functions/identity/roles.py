"""Which roles a principal holds: DULY_ROLES by user id, group or IAM ARN, and the default.

A token's groups claim and an IAM caller's role ARN name groups; a named
API key carries its roles itself. Every name DULY_ROLES lists adds its
roles; a principal none of them names holds DULY_DEFAULT_ROLE.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.base import settings as variables
from engine.base.errors import ConfigurationError
from functions.identity.principal import Role, role_of

NO_ROLE = "none"  # DULY_DEFAULT_ROLE's word for "no role at all"
MAX_NAME = 2048  # characters of a user id, group or ARN that DULY_ROLES lists


class CredentialRefused(Exception):
    """A credential that names no principal: the sentence says why, never the credential."""


@dataclass(frozen=True)
class RoleMap:
    """DULY_ROLES and DULY_DEFAULT_ROLE, read once."""

    by_name: Mapping[str, frozenset[Role]]
    default: frozenset[Role]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RoleMap:
        """DULY_ROLES (a JSON object of name to roles) and DULY_DEFAULT_ROLE."""
        default_word = variables.DEFAULT_ROLE.read(environ)
        default = frozenset() if default_word.lower() == NO_ROLE else {_role(default_word)}
        raw = variables.ROLES.read(environ)
        return cls(by_name=_parse_roles(raw) if raw else {}, default=frozenset(default))

    def roles_for(self, user: str, groups: Iterable[str] = ()) -> frozenset[Role]:
        """The roles `user` holds, directly or through `groups`; the default when none."""
        found: set[Role] = set()
        for name in (user, *groups):
            found |= self.by_name.get(name, frozenset())
        return frozenset(found) if found else self.default


def roles_of(words: object, where: str) -> frozenset[Role]:
    """A JSON list of role words as roles; ConfigurationError naming `where` otherwise."""
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise ConfigurationError(f'{where} must be a list of roles, such as ["operator"].')
    return frozenset(_role(word, where) for word in words)


def _parse_roles(raw: str) -> dict[str, frozenset[Role]]:
    try:
        document = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigurationError("DULY_ROLES must be a JSON object of names to roles.") from None
    if not isinstance(document, dict):
        raise ConfigurationError("DULY_ROLES must be a JSON object of names to roles.")
    table: dict[str, frozenset[Role]] = {}
    for name, words in document.items():
        if not name or len(name) > MAX_NAME:
            raise ConfigurationError(f"DULY_ROLES names must be 1 to {MAX_NAME} characters.")
        table[name] = roles_of(words, f"DULY_ROLES[{name!r}]")
    return table


def _role(word: str, where: str = "DULY_DEFAULT_ROLE") -> Role:
    try:
        return role_of(word)
    except ValueError as refused:
        raise ConfigurationError(f"{where}: {refused}") from None
