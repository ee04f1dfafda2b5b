"""OpenID Connect bearer tokens against a local issuer (tests/oidc_issuer.py): who they name.

- the settings: none without an issuer, the audience defaulting to the client id, and an
  issuer with neither refused: test_the_settings_come_from_the_environment
- a good token names its user, groups (a list, or a space-separated string), display
  name and the roles DULY_ROLES gives them; the discovery document and keys are fetched
  once: test_a_good_token_names_its_principal
- a token a minute past its expiry is still taken (60 s leeway):
  test_a_token_within_the_leeway_is_taken
- refused, each with its reason and never the token's text: another audience, another
  issuer, expired, HS256 signed with the issuer's public key, "none", a kid the issuer
  does not publish, a token without the user claim, text that is no JWT:
  test_bad_tokens_are_refused_with_a_reason
- the API takes the issuer's tokens as bearers: a good one reads, its groups' roles
  decide what it may write, a bad one is a 401 saying why, and an unreachable issuer
  is a 401 too, never a 500: test_the_api_takes_the_issuers_tokens
- an issuer that cannot be reached is a refusal ("the issuer's keys could not be
  fetched"), not an error: test_an_unreachable_issuer_is_a_refusal
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import socket
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from engine.base.errors import ConfigurationError
from functions import examples
from functions.app import create_app
from functions.identity.oidc import DISCOVERY_PATH, KEYS_UNREACHABLE, OidcSettings, OidcVerifier
from functions.identity.principal import Role, Via
from functions.identity.roles import CredentialRefused, RoleMap
from tests.conftest import Database
from tests.helpers import serving
from tests.oidc_issuer import CLIENT_ID, LocalIssuer, new_key

ROLES = RoleMap(by_name={"group:ops": frozenset({Role.OPERATOR})}, default=frozenset({Role.VIEWER}))


def verifier_of(issuer: LocalIssuer, **environ: str) -> OidcVerifier:
    settings = OidcSettings.from_env(
        {"DULY_OIDC_ISSUER": issuer.issuer, "DULY_OIDC_CLIENT_ID": CLIENT_ID, **environ}
    )
    assert settings is not None
    return OidcVerifier(settings, ROLES)


def test_the_settings_come_from_the_environment() -> None:
    assert OidcSettings.from_env({}) is None
    settings = OidcSettings.from_env(
        {"DULY_OIDC_ISSUER": "https://id.example", "DULY_OIDC_CLIENT_ID": "console"}
    )
    assert settings is not None
    assert (settings.audience, settings.user_claim, settings.groups_claim) == (
        "console",
        "sub",
        "groups",
    )
    api = OidcSettings.from_env(
        {
            "DULY_OIDC_ISSUER": "https://id.example",
            "DULY_OIDC_AUDIENCE": "duly-api",
            "DULY_OIDC_USER_CLAIM": "cognito:username",
        }
    )
    assert api is not None and (api.audience, api.client_id, api.user_claim) == (
        "duly-api",
        None,
        "cognito:username",
    )
    with pytest.raises(ConfigurationError, match="DULY_OIDC_AUDIENCE or DULY_OIDC_CLIENT_ID"):
        OidcSettings.from_env({"DULY_OIDC_ISSUER": "https://id.example"})
    with pytest.raises(ConfigurationError, match="https:// URL"):
        OidcSettings.from_env({"DULY_OIDC_ISSUER": "id.example", "DULY_OIDC_CLIENT_ID": "c"})


def test_an_issuer_without_the_oidc_extra_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyjwt alone cannot check RS256 or ES256: without cryptography (duly[oidc]), an issuer
    configured is a ConfigurationError naming the extra, not a 401 on every login."""
    monkeypatch.setattr("functions.identity.oidc.has_crypto", False)
    environ = {"DULY_OIDC_ISSUER": "https://issuer.example", "DULY_OIDC_CLIENT_ID": "duly"}
    with pytest.raises(ConfigurationError, match=r"duly\[oidc\]"):
        OidcSettings.from_env(environ)


async def test_a_good_token_names_its_principal(oidc_issuer: LocalIssuer) -> None:
    verifier = verifier_of(oidc_issuer)
    token = oidc_issuer.mint("u-1", ["ops", "finance"], name="Ada Lovelace")
    principal = await verifier.principal(token)
    assert (principal.id, principal.via, principal.name) == ("u-1", Via.OIDC, "Ada Lovelace")
    assert principal.groups == {"ops", "finance"}
    assert principal.has(Role.OPERATOR) and not principal.has(Role.ADMIN)
    # Groups as one space-separated string; the email when there is no name; the default role.
    spaced = await verifier.principal(oidc_issuer.mint("u-2", "a b", email="b@example.com"))
    assert (spaced.groups, spaced.shown, spaced.roles) == (
        {"a", "b"},
        "b@example.com",
        {Role.VIEWER},
    )
    # Another user claim names the user by it.
    named = verifier_of(oidc_issuer, DULY_OIDC_USER_CLAIM="email")
    assert (await named.principal(oidc_issuer.mint("u-3", email="c@example.com"))).id == (
        "c@example.com"
    )
    for _ in range(3):
        await verifier.principal(token)
    assert oidc_issuer.requests.count(DISCOVERY_PATH) == 2  # once per verifier
    assert oidc_issuer.requests.count("/jwks") == 2


async def test_a_token_within_the_leeway_is_taken(oidc_issuer: LocalIssuer) -> None:
    now = int(time.time())
    late = oidc_issuer.mint("u-late", iat=now - 400, exp=now - 30)
    assert (await verifier_of(oidc_issuer).principal(late)).id == "u-late"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_signed(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None) -> str:
    """A JWT signed with HMAC-SHA256 under `secret` (or unsigned for None), as an attacker
    would make one: PyJWT itself refuses to sign HS256 with a public key."""
    signed = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    mac = hmac.new(secret, signed.encode(), hashlib.sha256).digest() if secret else b""
    return f"{signed}.{_b64(mac)}"


async def test_bad_tokens_are_refused_with_a_reason(oidc_issuer: LocalIssuer) -> None:
    verifier = verifier_of(oidc_issuer)
    now = int(time.time())
    claims = {"iss": oidc_issuer.issuer, "sub": "mallory", "aud": CLIENT_ID, "iat": now}
    claims["exp"] = now + 300
    public_pem = oidc_issuer.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    bad = {
        "The token is for another audience.": oidc_issuer.mint("u", aud="another-app"),
        "The token is from another issuer.": oidc_issuer.mint("u", iss="https://evil.example"),
        "The token has expired.": oidc_issuer.mint("u", iat=now - 900, exp=now - 120),
        "The token is not valid yet.": oidc_issuer.mint("u", nbf=now + 600),
        "The token is not signed with an asymmetric algorithm.": hand_signed(
            {"alg": "HS256", "typ": "JWT", "kid": oidc_issuer.kid}, claims, public_pem
        ),
        "The token's key (kid) is not one of the issuer's.": oidc_issuer.mint(
            "u", key=new_key(), kid="rotated-away"
        ),
        "The token's signature does not verify.": oidc_issuer.mint("u", key=new_key()),
        "The token has no sub claim.": oidc_issuer.mint("", name="nobody"),
        "The token is not a well-formed JWT.": "not-a-jwt",
        "The token lacks the exp claim.": hand_signed_rs256(oidc_issuer, without="exp"),
    }
    for reason, token in bad.items():
        with pytest.raises(CredentialRefused) as refused:
            await verifier.principal(token)
        assert str(refused.value) == reason, (reason, str(refused.value))
        assert token not in str(refused.value)
    unsigned = hand_signed({"alg": "none", "kid": oidc_issuer.kid}, claims, None)
    with pytest.raises(CredentialRefused, match="asymmetric algorithm"):
        await verifier.principal(unsigned)


def hand_signed_rs256(issuer: LocalIssuer, without: str) -> str:
    """A good RS256 token of the issuer lacking one required claim."""
    now = int(time.time())
    claims = {"iss": issuer.issuer, "sub": "u", "aud": CLIENT_ID, "iat": now, "exp": now + 60}
    del claims[without]
    return jwt.encode(claims, issuer.key, algorithm="RS256", headers={"kid": issuer.kid})


async def test_an_unreachable_issuer_is_a_refusal(oidc_issuer: LocalIssuer) -> None:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = OidcSettings(issuer=f"http://127.0.0.1:{port}", audience=CLIENT_ID)
    verifier = OidcVerifier(settings, ROLES)
    with pytest.raises(CredentialRefused, match=f"^{re.escape(KEYS_UNREACHABLE)}$"):
        await verifier.principal(oidc_issuer.mint("u"))
    # The keys' own URL unreachable (DULY_OIDC_JWKS_URL) is the same refusal.
    elsewhere = verifier_of(oidc_issuer, DULY_OIDC_JWKS_URL=f"http://127.0.0.1:{port}/jwks")
    with pytest.raises(CredentialRefused, match=f"^{re.escape(KEYS_UNREACHABLE)}$"):
        await elsewhere.principal(oidc_issuer.mint("u"))


async def test_the_api_takes_the_issuers_tokens(
    db: Database, monkeypatch: pytest.MonkeyPatch, oidc_issuer: LocalIssuer
) -> None:
    monkeypatch.setenv("DULY_OIDC_ISSUER", oidc_issuer.issuer)
    monkeypatch.setenv("DULY_OIDC_AUDIENCE", "duly-api")
    monkeypatch.setenv("DULY_ROLES", json.dumps({"group:ops": ["operator"]}))
    Session = await db.create(examples.Base.metadata)

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    start = {"step": "welcome", "row": {"user_id": "u-jwt", "email": "j@example.com"}}
    async with serving(create_app(Session, run_worker=False)) as client:
        assert (await client.get("/workflows")).status_code == 401
        reader = oidc_issuer.mint("reader", aud="duly-api")
        assert (await client.get("/workflows", headers=bearer(reader))).status_code == 200
        refused = await client.post(
            "/workflows/onboarding/start", json=start, headers=bearer(reader)
        )
        assert refused.status_code == 403  # a viewer, by DULY_DEFAULT_ROLE
        operator = oidc_issuer.mint("ops-person", ["ops"], aud="duly-api")
        started = await client.post(
            "/workflows/onboarding/start", json=start, headers=bearer(operator)
        )
        assert started.status_code in (200, 201), started.text
        console_token = oidc_issuer.mint("reader")  # the console client's audience
        other = await client.get("/workflows", headers=bearer(console_token))
        assert other.status_code == 401
        assert other.json()["detail"] == "The token is for another audience."
        oidc_issuer.stop()  # the keys stay cached: a known kid needs no fetch
        assert (await client.get("/workflows", headers=bearer(reader))).status_code == 200
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("DULY_OIDC_ISSUER", f"http://127.0.0.1:{port}")
    async with serving(create_app(Session, run_worker=False)) as client:
        gone = await client.get("/workflows", headers=bearer(reader))
        assert gone.status_code == 401 and gone.json()["detail"] == KEYS_UNREACHABLE
