"""Secrets taken out of text duly keeps or shows: a failed attempt's traceback.

`scrub_secrets` masks every value a secret `DULY_*` setting holds (the API and
metrics tokens, the webhook secrets, the OIDC client's secret, the database URLs'
passwords), every password written in a URL (`scheme://user:***@host`) and every
API key duly issued (`duly_` and 43 characters), whatever the text says around them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlsplit

from engine.base import settings as variables

MASK = "***"  # what a secret reads as once scrubbed
MIN_SECRET_LENGTH = 4  # characters: a shorter value would mask ordinary words
# `scheme://user:password@`: the password is what lies between the user's colon and the `@`.
URL_PASSWORD = re.compile(r"(?P<start>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^@/?#\s]+@")
# A key `duly keys new` prints: `duly_` and 256 random bits in URL-safe base64.
API_KEY = re.compile(r"\bduly_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
URL_SETTINGS = (variables.DATABASE_URL, variables.TEST_DATABASE_URL)


def scrub_secrets(
    text: str, environ: Mapping[str, str] | None = None, *, also: Iterable[str] = ()
) -> str:
    """`text` with every configured secret (read from `environ`, else the process's
    environment), each of `also`, URL passwords and API keys replaced by MASK."""
    values = {value for value in (*configured_secrets(environ), *also) if value}
    # The longest first, so a secret that holds another is masked whole.
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= MIN_SECRET_LENGTH:
            text = text.replace(value, MASK)
    text = URL_PASSWORD.sub(lambda found: found["start"] + MASK + "@", text)
    return API_KEY.sub(MASK, text)


def configured_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secret values the settings hold: each secret setting's text, the passwords of
    the database URLs (as written and decoded), each of DULY_WEBHOOK_SECRETS' secrets."""
    found: list[str] = []
    for setting in variables.SETTINGS:
        raw = setting.text(environ) if setting.secret else None
        if raw is None:
            continue
        found.append(raw)
        if setting in URL_SETTINGS:
            found += _url_passwords(raw)
        elif setting is variables.WEBHOOK_SECRETS:
            found += _listed_secrets(raw)
    return found


def _url_passwords(url: str) -> list[str]:
    try:
        password = urlsplit(url).password
    except ValueError:  # not a URL urlsplit reads: its text as a whole is still masked
        return []
    return [password, unquote(password)] if password else []


def _listed_secrets(raw: str) -> list[str]:
    """The `secret` of each entry of DULY_WEBHOOK_SECRETS' JSON list, however malformed."""
    try:
        entries = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(entries, list):
        return []
    return [
        entry["secret"]
        for entry in entries
        if isinstance(entry, dict) and isinstance(entry.get("secret"), str)
    ]
