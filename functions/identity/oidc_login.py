"""A person's login at the issuer: the authorization-code flow with PKCE (S256), state and nonce.

A flow's `state`, `nonce` and PKCE `code_verifier` are each an HMAC of one
random secret, the one the browser's login cookie holds: the callback
derives them again from the cookie, so nothing is stored on the server and
no key needs sharing between processes (see docs/architecture.md, "The
console"). `finish` trades the code for an ID token and verifies it: the
login is its principal, good until the token's `exp`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime

from functions.identity.oidc import OidcVerifier, fetch_json
from functions.identity.principal import Principal
from functions.identity.roles import CredentialRefused

LOGIN_SCOPES = "openid profile email"
MAX_CODE = 2000  # characters of an authorization code the callback takes


def _derived(secret: str, purpose: str) -> str:
    mac = hmac.new(secret.encode(), f"duly oidc {purpose}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class LoginFlow:
    """One login's values, all derived from the secret the login cookie holds."""

    secret: str

    @classmethod
    def new(cls) -> LoginFlow:
        """A flow of a fresh random secret."""
        return cls(secrets.token_urlsafe(32))

    @property
    def state(self) -> str:
        """What the issuer hands back unchanged: the callback's proof it is this flow's."""
        return _derived(self.secret, "state")

    @property
    def nonce(self) -> str:
        """What the ID token must carry: it was issued for this flow."""
        return _derived(self.secret, "nonce")

    @property
    def code_verifier(self) -> str:
        """PKCE's verifier: 43 characters, sent only with the code."""
        return _derived(self.secret, "verifier")

    @property
    def code_challenge(self) -> str:
        """PKCE's S256 challenge of the verifier, sent with the person to the issuer."""
        digest = hashlib.sha256(self.code_verifier.encode()).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class Login:
    """A finished login: who the ID token names, and when the token expires."""

    principal: Principal
    expires: datetime


async def authorization_url(verifier: OidcVerifier, redirect_uri: str, flow: LoginFlow) -> str:
    """Where to send the person: the issuer's authorization endpoint with this flow's values."""
    settings = verifier.settings
    endpoint = (await verifier.discovery()).authorization_endpoint
    if endpoint is None or settings.client_id is None:
        raise CredentialRefused("The issuer offers no authorization endpoint.")
    query = {
        "response_type": "code",
        "client_id": settings.client_id,
        "redirect_uri": redirect_uri,
        "scope": LOGIN_SCOPES,
        "state": flow.state,
        "nonce": flow.nonce,
        "code_challenge": flow.code_challenge,
        "code_challenge_method": "S256",
    }
    separator = "&" if urllib.parse.urlsplit(endpoint).query else "?"
    return endpoint + separator + urllib.parse.urlencode(query)


async def finish(
    verifier: OidcVerifier, flow: LoginFlow, state: str, code: str, redirect_uri: str
) -> Login:
    """The login of a callback's code: its state checked, the code traded, the ID token
    verified (audience the client id, nonce this flow's); CredentialRefused saying why not."""
    settings = verifier.settings
    if not hmac.compare_digest(state.encode(), flow.state.encode()):
        raise CredentialRefused("The login's state does not match: start the login again.")
    endpoint = (await verifier.discovery()).token_endpoint
    if endpoint is None or settings.client_id is None:
        raise CredentialRefused("The issuer offers no token endpoint.")
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "client_id": settings.client_id,
        "code_verifier": flow.code_verifier,
    }
    if settings.client_secret is not None:
        form["client_secret"] = settings.client_secret
    try:
        reply = await asyncio.to_thread(fetch_json, endpoint, form)
    except (OSError, ValueError):
        raise CredentialRefused("The issuer did not exchange the login's code.") from None
    id_token = reply.get("id_token") if isinstance(reply, dict) else None
    if not isinstance(id_token, str):
        raise CredentialRefused("The issuer's reply has no ID token.")
    claims = await verifier.claims(id_token, audience=settings.client_id)
    nonce = claims.get("nonce")
    if not isinstance(nonce, str) or not hmac.compare_digest(nonce.encode(), flow.nonce.encode()):
        raise CredentialRefused("The ID token's nonce is not this login's.")
    expires = datetime.fromtimestamp(float(claims["exp"]), UTC)  # required, and checked
    return Login(verifier.principal_of(claims), expires)
