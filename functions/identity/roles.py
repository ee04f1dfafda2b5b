"""Which roles a principal holds: DULY_ROLES by kinded name, and the default.

Each DULY_ROLES name says its kind: `user:<id>` (an issuer's user claim),
`group:<name>` (its groups claim) or `iam:<arn>` (a Function URL caller, its
role, or its account's `arn:aws:iam::<id>:root`), so a user whose id is a
group's name gains nothing. A named API key carries its roles itself. Every
entry naming a principal adds its roles; one none names holds DULY_DEFAULT_ROLE.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine import ConfigurationError, settings as variables
from functions.identity.principal import Role, role_of

NO_ROLE = "none"  # DULY_DEFAULT_ROLE's word for "no role at all"
MAX_NAME = 2048  # characters of a user id, group or ARN that DULY_ROLES lists
USER, GROUP, IAM = "user", "group", "iam"  # the kinds of name DULY_ROLES lists
KINDS = (USER, GROUP, IAM)


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

    def roles_for(self, names: Iterable[str]) -> frozenset[Role]:
        """The roles of a principal's kinded `names` (`kinded`); the default when none."""
        found: set[Role] = set()
        for name in names:
            found |= self.by_name.get(name, frozenset())
        return frozenset(found) if found else self.default

    def user_roles(self, user: str, groups: Iterable[str] = ()) -> frozenset[Role]:
        """The roles of an issuer's user: its `user:` entry and its groups' `group:` ones."""
        return self.roles_for([kinded(USER, user), *(kinded(GROUP, g) for g in groups)])


def kinded(kind: str, name: str) -> str:
    """How DULY_ROLES lists `name` of `kind`: `kind:name`."""
    return f"{kind}:{name}"


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
        table[_kinded_name(name)] = roles_of(words, f"DULY_ROLES[{name!r}]")
    return table


def _kinded_name(name: str) -> str:
    """`name` as listed, once it says its kind; ConfigurationError showing the kinded form."""
    kind, colon, rest = name.partition(":")
    if colon and kind in KINDS and rest:
        return name
    shown = repr(name[:80])
    if name.startswith("arn:"):
        ways = f'"{kinded(IAM, name[:80])}"'
    else:
        ways = f'"{kinded(GROUP, name[:80])}" or "{kinded(USER, name[:80])}"'
    raise ConfigurationError(
        f"DULY_ROLES names {shown} without its kind: write {ways}. Each name says what it "
        "is (user: an issuer's user claim, group: its groups claim, iam: an IAM ARN), so a "
        "user named like a group gains nothing; a key's roles are in DULY_API_KEYS."
    )


def _role(word: str, where: str = "DULY_DEFAULT_ROLE") -> Role:
    try:
        return role_of(word)
    except ValueError as refused:
        raise ConfigurationError(f"{where}: {refused}") from None
