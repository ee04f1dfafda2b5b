"""From a request's credential to its principal: a bearer token, or a Function URL's IAM caller.

A bearer is, in this order: DULY_API_TOKEN (the admin "api-token"), a named
key of DULY_API_KEYS, DULY_METRICS_TOKEN (held to `GET /metrics`), or a JWT
of the configured OpenID Connect issuer. Signed webhooks and the console's
sessions name their principals in their own modules.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine import settings as variables
from functions.identity.iam import iam_caller, iam_principal
from functions.identity.keys import KeyRing
from functions.identity.oidc import OidcSettings, OidcVerifier
from functions.identity.principal import ADMIN_TOKEN_ID, METRICS_ID, Principal, Role, Via
from functions.identity.roles import CredentialRefused, RoleMap

METRICS_ROUTES = frozenset({"GET /metrics"})
UNKNOWN_BEARER = "The bearer token is not one this server knows."


class BearerVerifier(Protocol):
    """What turns a bearer JWT into a principal (an OpenID Connect issuer's verifier)."""

    async def principal(self, token: str) -> Principal:
        """The token's principal; CredentialRefused with a short reason when it names none."""
        ...


@dataclass(frozen=True)
class Credentials:
    """The bearer credentials a deployment takes, and how roles are granted."""

    token: str | None = None
    keys: KeyRing = field(default_factory=KeyRing)
    roles: RoleMap = field(default_factory=lambda: RoleMap({}, frozenset({Role.VIEWER})))
    metrics_token: str | None = None
    oidc: BearerVerifier | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Credentials:
        """DULY_API_TOKEN, DULY_API_KEYS, DULY_METRICS_TOKEN, DULY_ROLES and the issuer."""
        roles = RoleMap.from_env(environ)
        issuer = OidcSettings.from_env(environ)
        return cls(
            token=variables.API_TOKEN.read(environ),
            keys=KeyRing.from_env(environ),
            roles=roles,
            metrics_token=variables.METRICS_TOKEN.read(environ),
            oidc=OidcVerifier(issuer, roles) if issuer is not None else None,
        )

    @property
    def configured(self) -> bool:
        """Whether any bearer credential is configured."""
        return bool(self.token or self.keys.keys or self.metrics_token or self.oidc)

    async def bearer(self, presented: str) -> Principal:
        """The principal a bearer token names; CredentialRefused when it names none."""
        typed = self.typed(presented)
        if typed is not None:
            return typed
        if _same(presented, self.metrics_token):
            roles = frozenset({Role.VIEWER})
            return Principal(id=METRICS_ID, roles=roles, via=Via.TOKEN, routes=METRICS_ROUTES)
        if self.oidc is not None and presented.count(".") == 2:
            return await self.oidc.principal(presented)
        raise CredentialRefused(UNKNOWN_BEARER)

    def typed(self, presented: str) -> Principal | None:
        """The principal of the admin token or a named key (what a person may also type into
        the console's login); None for anything else."""
        if _same(presented, self.token):
            return Principal(id=ADMIN_TOKEN_ID, roles=frozenset({Role.ADMIN}), via=Via.TOKEN)
        key = self.keys.find(presented)
        return key.principal() if key is not None else None

    def iam(self, scope: Mapping[str, Any]) -> Principal | None:
        """The IAM caller of the Lambda Function URL event behind `scope`, if there is one."""
        caller = iam_caller(scope)
        return None if caller is None else iam_principal(caller, self.roles)


def _same(presented: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(presented.encode(), expected.encode())
