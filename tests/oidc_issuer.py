"""A local OpenID Connect issuer for tests: discovery, keys, the code flow, and minted tokens.

`LocalIssuer` serves on loopback from a thread: its RSA key is made here
(`cryptography`), never fetched. `/authorize` checks the client and the
redirect URI, requires an S256 `code_challenge`, keeps `state` and `nonce`,
and shows one button per user (or signs `preset` in directly); `/token` takes
each code once, checks its `code_verifier` and the client, and answers an
`id_token` and an access token. `mint(user, ...)` signs a token for API tests.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

CLIENT_ID = "duly-console"
TOKEN_SECONDS = 300  # how long a minted token is good for


def new_key() -> RSAPrivateKey:
    """A fresh 2048-bit RSA key."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key: RSAPrivateKey, kid: str) -> dict[str, Any]:
    """The public half of `key` as a JWK with its kid."""
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "alg": "RS256", "use": "sig"}


@dataclass
class Grant:
    """A code the issuer handed out: for whom, to which client and redirect, with what."""

    user: str
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str | None


@dataclass
class LocalIssuer:
    """An OIDC issuer on 127.0.0.1 for one test (or module): start(), then its `url`."""

    users: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: {"ada": {"name": "Ada Lovelace", "groups": ["ops"]}}
    )
    client_id: str = CLIENT_ID
    client_secret: str | None = None
    redirect_uris: set[str] = field(default_factory=set)
    preset: str | None = None  # a user /authorize signs in without showing its page
    kid: str = "test-key-1"
    key: RSAPrivateKey = field(default_factory=new_key)
    url: str = ""
    codes: dict[str, Grant] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)  # paths asked, in order
    _server: ThreadingHTTPServer | None = None

    def start(self) -> LocalIssuer:
        """Serve on a free loopback port from a daemon thread."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def issuer(self) -> str:
        """The `iss` of its tokens, and DULY_OIDC_ISSUER's value."""
        return self.url

    def discovery(self) -> dict[str, Any]:
        """The discovery document."""
        return {
            "issuer": self.issuer,
            "jwks_uri": f"{self.url}/jwks",
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "id_token_signing_alg_values_supported": ["RS256"],
        }

    def mint(
        self,
        user: str,
        groups: list[str] | str | None = None,
        *,
        key: RSAPrivateKey | str | bytes | None = None,
        algorithm: str = "RS256",
        kid: str | None = None,
        **claims: Any,
    ) -> str:
        """A signed token naming `user`: `aud` the client, good for 5 minutes, unless
        `claims` say otherwise; `key`, `algorithm` and `kid` sign it some other way."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": self.issuer,
            "sub": user,
            "aud": self.client_id,
            "iat": now,
            "exp": now + TOKEN_SECONDS,
            **({"groups": groups} if groups is not None else {}),
            **claims,
        }
        signing = self.key if key is None else key
        headers = {"kid": kid or self.kid}
        return jwt.encode(body, signing, algorithm=algorithm, headers=headers)  # type: ignore[arg-type]

    # -- the code flow ---------------------------------------------------------------------

    def authorize(self, query: Mapping[str, str], user: str | None) -> tuple[int, str]:
        """An /authorize request: (302, where to) once a user is chosen, (200, page) to
        choose one, or (400, why) for a request the flow refuses."""
        refused = self._refused(query)
        if refused is not None:
            return 400, refused
        user = user or self.preset
        if user is None:
            return 200, self._choice_page(query)
        if user not in self.users:
            return 400, f"no user {user!r}"
        code = secrets.token_urlsafe(16)
        self.codes[code] = Grant(
            user=user,
            client_id=query["client_id"],
            redirect_uri=query["redirect_uri"],
            challenge=query["code_challenge"],
            nonce=query.get("nonce"),
        )
        back = {"code": code, **({"state": query["state"]} if "state" in query else {})}
        return 302, f"{query['redirect_uri']}?{urlencode(back)}"

    def _refused(self, query: Mapping[str, str]) -> str | None:
        if query.get("response_type") != "code":
            return "response_type must be code"
        if query.get("client_id") != self.client_id:
            return "unknown client_id"
        if query.get("redirect_uri") not in self.redirect_uris:
            return "redirect_uri is not registered"
        if not query.get("code_challenge") or query.get("code_challenge_method") != "S256":
            return "an S256 code_challenge is required"
        return None

    def _choice_page(self, query: Mapping[str, str]) -> str:
        hidden = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
            for k, v in query.items()
        )
        buttons = "".join(
            f'<button type="submit" name="user" value="{html.escape(user)}">'
            f"Sign in as {html.escape(user)}</button>"
            for user in self.users
        )
        return (
            '<!doctype html><html lang="en"><head><title>Local issuer</title></head><body>'
            f'<main><h1>Local issuer</h1><form method="post" action="/authorize">'
            f"{hidden}{buttons}</form></main></body></html>"
        )

    def token(self, form: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """A /token request: (200, tokens) or (400, an OAuth error)."""
        grant = self.codes.pop(form.get("code", ""), None)  # a code works once
        if form.get("grant_type") != "authorization_code" or grant is None:
            return 400, {"error": "invalid_grant"}
        if form.get("client_id") != grant.client_id or (
            self.client_secret is not None and form.get("client_secret") != self.client_secret
        ):
            return 400, {"error": "invalid_client"}
        if form.get("redirect_uri") != grant.redirect_uri:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri differs"}
        verifier = form.get("code_verifier", "")
        digest = hashlib.sha256(verifier.encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant.challenge:
            return 400, {"error": "invalid_grant", "error_description": "code_verifier"}
        profile = dict(self.users[grant.user])
        nonce = {"nonce": grant.nonce} if grant.nonce is not None else {}
        return 200, {
            "id_token": self.mint(grant.user, **profile, **nonce),
            "access_token": self.mint(grant.user, **profile),
            "token_type": "Bearer",
            "expires_in": TOKEN_SECONDS,
        }


def _handler_for(issuer: LocalIssuer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the test says what went wrong

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            issuer.requests.append(parts.path)
            if parts.path == "/.well-known/openid-configuration":
                self._json(200, issuer.discovery())
            elif parts.path == "/jwks":
                self._json(200, {"keys": [public_jwk(issuer.key, issuer.kid)]})
            elif parts.path == "/authorize":
                self._authorize(_single(parse_qs(parts.query)), None)
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            issuer.requests.append(parts.path)
            length = int(self.headers.get("content-length") or 0)
            form = _single(parse_qs(self.rfile.read(length).decode()))
            if parts.path == "/token":
                self._json(*issuer.token(form))
            elif parts.path == "/authorize":
                user = form.pop("user", None)
                self._authorize(form, user)
            else:
                self._json(404, {"error": "not_found"})

        def _authorize(self, query: dict[str, str], user: str | None) -> None:
            status, text = issuer.authorize(query, user)
            if status == 302:
                self.send_response(302)
                self.send_header("Location", text)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, document: Any) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _single(values: dict[str, list[str]]) -> dict[str, str]:
    return {name: found[0] for name, found in values.items() if found}
