"""How guessable a configured key is: its length, and how much its characters repeat.

A token or secret of sixteen characters may still hold next to nothing to
guess ("aaaaaaaaaaaaaaaa", "abababababababab"). `key_refusal` estimates a
key's bits from how often each character repeats (what a random key of 16
or more characters passes in all but a few in a million cases) and says
what to do instead, never showing the key. It imports only the standard library.
"""

from __future__ import annotations

import math
from collections import Counter

MIN_KEY_LENGTH = 16  # characters of a token or signing secret: a guessable key is refused
MIN_KEY_BITS = 32.0  # the least estimated bits a key holds
NEW_KEY = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def estimated_bits(key: str) -> float:
    """The key's length times the entropy of its characters' frequencies, in bits."""
    counts = Counter(key).values()
    return -sum(n * math.log2(n / len(key)) for n in counts)


def key_refusal(where: str, key: str) -> str | None:
    """Why the key `where` names is refused (too short, or too repetitive); None if good."""
    if len(key) < MIN_KEY_LENGTH:
        return (
            f"{where} must be at least {MIN_KEY_LENGTH} characters: a random key, such as "
            f"{NEW_KEY} prints."
        )
    if estimated_bits(key) < MIN_KEY_BITS:
        return (
            f"{where} repeats too few characters to be a random key: use one such as "
            f"{NEW_KEY} prints."
        )
    return None
