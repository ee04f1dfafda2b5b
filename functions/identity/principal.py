"""A principal (who a credential names) and the four roles a route may ask of it.

A role implies the ones below it: admin takes everything, operator and
designer each take viewer's reads. A principal may also be held to named
routes (a scoped signing secret, the metrics token): `route_allowed`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase


class Role(StrEnum):
    """What a principal may do; each route names the least role it takes."""

    VIEWER = "viewer"  # reads
    OPERATOR = "operator"  # start, run, cancel, deliver, replay, wake, drain, publish
    DESIGNER = "designer"  # save and activate graph templates
    ADMIN = "admin"  # all of it, and acting on behalf of another user


IMPLIED: dict[Role, frozenset[Role]] = {
    Role.VIEWER: frozenset({Role.VIEWER}),
    Role.OPERATOR: frozenset({Role.OPERATOR, Role.VIEWER}),
    Role.DESIGNER: frozenset({Role.DESIGNER, Role.VIEWER}),
    Role.ADMIN: frozenset(Role),
}
ROLE_WORDS = ", ".join(role.value for role in Role)


class Via(StrEnum):
    """How a principal was named: which kind of credential."""

    OPEN = "open"  # no credential is configured: local development
    TOKEN = "token"  # the shared DULY_API_TOKEN
    API_KEY = "api-key"  # a named key of DULY_API_KEYS
    OIDC = "oidc"  # a bearer JWT of the configured issuer
    IAM = "iam"  # a SigV4-signed Lambda Function URL call
    SIGNATURE = "signature"  # an HMAC-signed webhook
    SESSION = "session"  # the console's login


def role_of(word: str) -> Role:
    """The role a word names; ValueError listing the roles for any other word."""
    try:
        return Role(word.strip().lower())
    except ValueError:
        raise ValueError(f"{word!r} is not a role: one of {ROLE_WORDS}.") from None


def granted(roles: Iterable[Role]) -> frozenset[Role]:
    """`roles` with every role they imply."""
    return frozenset(implied for role in roles for implied in IMPLIED[role])


@dataclass(frozen=True)
class Principal:
    """Who is acting: an id (what the audit trail records), roles, groups and the door used.

    `routes`, when set, holds the principal to those requests whatever its
    roles allow: `"METHOD /path"` patterns, where `*` stands for any text
    (`"POST /workflows/refund/deliver"`, `"GET /metrics"`, `"POST /workflows/*"`).
    """

    id: str
    roles: frozenset[Role]
    via: Via
    groups: frozenset[str] = frozenset()
    name: str | None = None  # a person's display name, when the credential says one
    routes: frozenset[str] | None = field(default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", granted(self.roles))

    def has(self, role: Role) -> bool:
        """Whether the principal holds `role` (or a role implying it)."""
        return role in self.roles

    def route_allowed(self, method: str, path: str) -> bool:
        """Whether the principal may send `method` to `path` (any request when unheld)."""
        if self.routes is None:
            return True
        request = f"{method.upper()} {path}"
        return any(fnmatchcase(request, pattern) for pattern in self.routes)

    @property
    def may_act_for_others(self) -> bool:
        """Whether the principal may name another user as the one acting (admin only)."""
        return self.has(Role.ADMIN)

    @property
    def shown(self) -> str:
        """How pages and logs name the principal."""
        return self.name or self.id


ADMIN_TOKEN_ID = "api-token"  # who DULY_API_TOKEN acts as, in the audit trail
METRICS_ID = "metrics"  # who DULY_METRICS_TOKEN acts as
LOCAL_ID = "local"  # everyone, when nothing asks for a credential
SIGNED_PREFIX = "signed:"  # a signing secret's name acts as signed:<name>
# The names duly's own principals act as: no key or issuer user may take one of them, nor
# look like a signer's or an IAM caller's (an ARN).
RESERVED_IDS = frozenset({ADMIN_TOKEN_ID, METRICS_ID, LOCAL_ID})
RESERVED_PREFIXES = (SIGNED_PREFIX, "arn:")

# With no credential configured anywhere (duly dev on loopback), everyone is this.
LOCAL = Principal(id=LOCAL_ID, roles=frozenset({Role.ADMIN}), via=Via.OPEN)


def reserved(name: str) -> bool:
    """Whether `name` is one duly's own principals act as, or looks like one (any case)."""
    return name.lower() in RESERVED_IDS or name.lower().startswith(RESERVED_PREFIXES)
