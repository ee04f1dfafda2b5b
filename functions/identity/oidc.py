"""OpenID Connect: a bearer JWT of the configured issuer, verified and turned into a principal.

`OidcSettings.from_env()` reads the OpenID Connect settings (None when no issuer
is set); `OidcVerifier.principal(token)` checks the token's signature against
the issuer's published keys (asymmetric algorithms only) and its iss, aud,
exp, nbf and iat, then names the principal by its user and groups claims.
The console's login (`functions.identity.oidc_login`) uses the same verifier.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from jwt import PyJWKClient
from jwt.algorithms import has_crypto

from engine import ConfigurationError, settings as variables
from functions.identity.principal import Principal, Via, reserved
from functions.identity.roles import CredentialRefused, RoleMap

DISCOVERY_PATH = "/.well-known/openid-configuration"
FETCH_TIMEOUT = 5.0  # seconds a call to the issuer may take
LEEWAY = 60  # seconds of clock difference allowed on exp, nbf and iat
KEYS_LIFESPAN = 300.0  # seconds the issuer's key set is kept before it is fetched again
MAX_DOCUMENT_BYTES = 1 << 20  # the largest discovery, key set or token reply read
# Asymmetric only: an HS* token could be signed with the issuer's public key, and "none" is
# not signed at all.
ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)
REQUIRED_CLAIMS = ("iss", "aud", "exp", "iat")
KEYS_UNREACHABLE = "The issuer's keys could not be fetched."


@dataclass(frozen=True)
class OidcSettings:
    """The issuer whose tokens name principals, and the console's client at it."""

    issuer: str
    audience: str
    client_id: str | None = None
    client_secret: str | None = None
    jwks_url: str | None = None
    user_claim: str = variables.OIDC_USER_CLAIM.default
    groups_claim: str = variables.OIDC_GROUPS_CLAIM.default

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OidcSettings | None:
        """The issuer's settings from the environment; None when DULY_OIDC_ISSUER is unset."""
        issuer = variables.OIDC_ISSUER.read(environ)
        if issuer is None:
            return None
        if urllib.parse.urlsplit(issuer).scheme not in ("https", "http"):
            raise ConfigurationError("DULY_OIDC_ISSUER must be the issuer's https:// URL.")
        if not has_crypto:
            raise ConfigurationError(
                "DULY_OIDC_ISSUER needs the issuer's key algorithms: pip install 'duly[oidc]' "
                "(or name duly[oidc] in the bundle's requirements.txt)."
            )
        client_id = variables.OIDC_CLIENT_ID.read(environ)
        audience = variables.OIDC_AUDIENCE.read(environ) or client_id
        if audience is None:
            raise ConfigurationError(
                "DULY_OIDC_ISSUER is set without DULY_OIDC_AUDIENCE or DULY_OIDC_CLIENT_ID: "
                "set the audience the issuer's tokens carry."
            )
        return cls(
            issuer=issuer,
            audience=audience,
            client_id=client_id,
            client_secret=variables.OIDC_CLIENT_SECRET.read(environ),
            jwks_url=variables.OIDC_JWKS_URL.read(environ),
            user_claim=variables.OIDC_USER_CLAIM.read(environ),
            groups_claim=variables.OIDC_GROUPS_CLAIM.read(environ),
        )


@dataclass(frozen=True)
class Discovery:
    """What the issuer's discovery document says: where its keys and endpoints are."""

    jwks_uri: str
    authorization_endpoint: str | None
    token_endpoint: str | None


def fetch_json(url: str, form: Mapping[str, str] | None = None) -> Any:
    """GET `url` (or POST `form` to it) and its JSON reply; OSError or ValueError if none.

    Blocking: call it through `asyncio.to_thread`.
    """
    if urllib.parse.urlsplit(url).scheme not in ("https", "http"):
        raise ValueError(f"{url!r} is not an http(s) URL")
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    request = urllib.request.Request(url, data=data, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT) as reply:
        return json.loads(reply.read(MAX_DOCUMENT_BYTES))


class OidcVerifier:
    """Verifies the issuer's JWTs; its discovery document and keys are fetched once and kept."""

    def __init__(self, settings: OidcSettings, roles: RoleMap) -> None:
        self.settings = settings
        self.roles = roles
        self._discovery: Discovery | None = None
        self._keys: PyJWKClient | None = None

    async def discovery(self) -> Discovery:
        """The issuer's discovery document; CredentialRefused when it cannot be fetched."""
        # Two first requests at once may both fetch it: harmless, and no lock ties the
        # verifier to one event loop.
        if self._discovery is None:
            self._discovery = await self._discover()
        return self._discovery

    async def _discover(self) -> Discovery:
        url = self.settings.issuer.rstrip("/") + DISCOVERY_PATH
        try:
            document = await asyncio.to_thread(fetch_json, url)
        except (OSError, ValueError):
            raise CredentialRefused(KEYS_UNREACHABLE) from None
        if not isinstance(document, dict):
            raise CredentialRefused(KEYS_UNREACHABLE)
        if document.get("issuer") != self.settings.issuer:
            raise CredentialRefused("The issuer's discovery document names another issuer.")
        jwks_uri = self.settings.jwks_url or document.get("jwks_uri")
        if not isinstance(jwks_uri, str):
            raise CredentialRefused(KEYS_UNREACHABLE)
        return Discovery(
            jwks_uri=jwks_uri,
            authorization_endpoint=_text(document.get("authorization_endpoint")),
            token_endpoint=_text(document.get("token_endpoint")),
        )

    async def _signing_key(self, token: str) -> jwt.PyJWK:
        if self._keys is None:
            found = await self.discovery()
            # The key set is cached; a kid it lacks makes it fetch the set once more.
            self._keys = PyJWKClient(found.jwks_uri, lifespan=KEYS_LIFESPAN, timeout=FETCH_TIMEOUT)
        try:
            return await asyncio.to_thread(self._keys.get_signing_key_from_jwt, token)
        except jwt.PyJWKClientConnectionError:
            raise CredentialRefused(KEYS_UNREACHABLE) from None
        except jwt.DecodeError:
            raise CredentialRefused("The token is not a well-formed JWT.") from None
        except jwt.PyJWKClientError:
            raise CredentialRefused("The token's key (kid) is not one of the issuer's.") from None

    async def claims(self, token: str, audience: str | None = None) -> dict[str, Any]:
        """The token's claims once its signature, iss, aud, exp, nbf and iat are good.

        `audience` defaults to the settings' (the console's ID tokens carry its client id).
        """
        key = await self._signing_key(token)
        try:
            return jwt.decode(
                token,
                key,
                algorithms=list(ALGORITHMS),
                audience=audience or self.settings.audience,
                issuer=self.settings.issuer,
                leeway=LEEWAY,
                options={"require": list(REQUIRED_CLAIMS)},
            )
        except jwt.InvalidTokenError as refused:
            raise CredentialRefused(_reason(refused)) from None

    def principal_of(self, claims: Mapping[str, Any]) -> Principal:
        """The principal verified claims name: the user claim, its groups, and their roles."""
        user = claims.get(self.settings.user_claim)
        if not isinstance(user, str) or not user:
            raise CredentialRefused(f"The token has no {self.settings.user_claim} claim.")
        if reserved(user):
            raise CredentialRefused("The token's user is a name duly keeps for its own principals.")
        groups = _groups(claims.get(self.settings.groups_claim))
        name = next(
            (claims[k] for k in ("name", "email") if isinstance(claims.get(k), str) and claims[k]),
            None,
        )
        return Principal(
            id=user,
            roles=self.roles.user_roles(user, groups),
            via=Via.OIDC,
            groups=groups,
            name=name,
        )

    async def principal(self, token: str) -> Principal:
        """The principal a bearer JWT names; CredentialRefused saying why it names none."""
        return self.principal_of(await self.claims(token))


def _groups(value: object) -> frozenset[str]:
    """A groups claim as group names: a list of them, or one space-separated string."""
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(group for group in value if isinstance(group, str) and group)
    return frozenset()


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _reason(refused: jwt.InvalidTokenError) -> str:
    """A short sentence for a refused token, never its text."""
    if isinstance(refused, jwt.MissingRequiredClaimError):
        return f"The token lacks the {refused.claim} claim."
    reasons: tuple[tuple[type[jwt.InvalidTokenError], str], ...] = (
        (jwt.ExpiredSignatureError, "The token has expired."),
        (jwt.ImmatureSignatureError, "The token is not valid yet."),
        (jwt.InvalidIssuedAtError, "The token's iat is not a time in the past."),
        (jwt.InvalidAudienceError, "The token is for another audience."),
        (jwt.InvalidIssuerError, "The token is from another issuer."),
        (jwt.InvalidAlgorithmError, "The token is not signed with an asymmetric algorithm."),
        (jwt.InvalidSignatureError, "The token's signature does not verify."),
        (jwt.DecodeError, "The token is not a well-formed JWT."),
    )
    for kind, reason in reasons:
        if isinstance(refused, kind):
            return reason
    return "The token is not valid."
