"""What a `DULY_*` setting is: a `Setting` (its default, check and meaning) and its kinds.

`engine.base.settings` declares every variable with these; this module says how a
variable's text becomes a typed value, or a `ConfigurationError` that names the
variable and never repeats a secret. It imports only the standard library.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from engine.base.errors import ConfigurationError
from engine.base.key_strength import key_refusal

T = TypeVar("T")

log = logging.getLogger("duly.settings")

PRODUCTION = "production"
LOCAL = "local"
NEVER = "never"  # a retention period that keeps that kind for good
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
MAX_DAYS = 36_500  # a century: a cutoff further back leaves the calendar
MAX_PORT = 65_535
MAX_PRUNE_BATCH_SIZE = 100_000  # past it a batch is no longer a short transaction
MAX_PAUSE_MS = 60_000  # a minute between batches at most


class RuleRefusal(ConfigurationError):
    """A value refused by a rule whose sentence shows no part of it (a secret's length)."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One `DULY_*` variable: how its text becomes a value, its default and what it means."""

    name: str
    default: T
    shown_default: str  # the default as the settings reference shows it
    meaning: str  # one line
    parse: Callable[[str], T] = field(repr=False, compare=False)
    secret: bool = False  # never repeated in a message
    exact: bool = False  # read as written: not stripped of surrounding spaces
    most: int = 0  # characters at most, when set

    def text(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable as set (stripped unless `exact`); None when unset or empty."""
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None:
            return None
        return (raw if self.exact else raw.strip()) or None

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """The variable's value: its default when unset or empty; a ConfigurationError naming
        it when its text is not a value it takes."""
        value = self.text(environ)
        if value is None:
            return self.default
        if self.most and len(value) > self.most:
            refused = f"{self.name} must be at most {self.most} characters, not {len(value)}."
            raise ConfigurationError(refused)
        try:
            return self.parse(value)
        except ConfigurationError as refused:
            if not self.secret or isinstance(refused, RuleRefusal):
                raise
            raise ConfigurationError(
                f"{self.name} is not a value it takes (not shown here: it holds a secret)."
            ) from None


def text(name: str, meaning: str, default: str, *, shown: str | None = None) -> Setting[str]:
    """A variable read as text, with a default."""
    return Setting(name, default, shown or default, meaning, parse=str)


def optional_text(
    name: str, meaning: str, *, shown: str = "unset", secret: bool = False, exact: bool = False
) -> Setting[str | None]:
    """A variable read as text; None when unset."""
    return Setting[str | None](name, None, shown, meaning, str, secret=secret, exact=exact)


def key(name: str, meaning: str) -> Setting[str | None]:
    """A secret key, read as written; None when unset; at least MIN_KEY_LENGTH characters,
    not too repetitive (`key_refusal`)."""

    def parse(raw: str) -> str:
        refused = key_refusal(name, raw)
        if refused is not None:
            raise RuleRefusal(refused)
        return raw

    return Setting[str | None](name, None, "unset", meaning, parse, secret=True, exact=True)


def flag(name: str, meaning: str, default: bool) -> Setting[bool]:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off, in any case."""
    return Setting(name, default, "on" if default else "off", meaning, _flag_parser(name))


def optional_flag(name: str, meaning: str, *, shown: str) -> Setting[bool | None]:
    """A yes/no variable whose default another setting decides (None when unset)."""
    return Setting[bool | None](name, None, shown, meaning, _flag_parser(name))


def _flag_parser(name: str) -> Callable[[str], bool]:
    def parse(raw: str) -> bool:
        word = raw.lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        words = ", ".join(sorted(TRUE_WORDS | FALSE_WORDS))
        raise ConfigurationError(f"{name} must be one of {words}, not {raw!r}.")

    return parse


def mode(name: str, meaning: str) -> Setting[str]:
    """The deployment's mode: `production` when it says so (any case), else `local`."""
    return Setting(name, LOCAL, LOCAL, meaning, _mode_of)


def _mode_of(raw: str) -> str:
    return PRODUCTION if raw.strip().lower() == PRODUCTION else LOCAL


def whole(
    name: str, meaning: str, default: int, *, least: int, most: int | None = None
) -> Setting[int]:
    """A whole number from `least` (to `most`); anything else is refused."""

    def parse(raw: str) -> int:
        return _whole_in(name, raw, least, most)

    shown = f"{default}" + (f" ({least} to {most})" if most is not None else f" (>= {least})")
    return Setting(name, default, shown, meaning, parse)


def _whole_in(name: str, raw: str, least: int, most: int | None, also: str = "") -> int:
    try:
        number = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number{also}, not {raw!r}.") from None
    if number < least or (most is not None and number > most):
        bound = f"from {least} to {most}" if most is not None else f"at least {least}"
        raise ConfigurationError(f"{name} must be {bound}, not {number}.")
    return number


def lenient_whole(name: str, meaning: str, default: int, *, least: int) -> Setting[int]:
    """A whole number raised to `least` when below it; text that is no whole number gives the
    default, with a warning in the log (the event layer's numbers, as they always were)."""

    def parse(raw: str) -> int:
        try:
            number = int(raw)
        except ValueError:
            log.warning("%s=%r is not a whole number; using %d.", name, raw, default)
            return default
        return max(number, least)

    return Setting(name, default, f"{default} (>= {least}, raised to it)", meaning, parse)


def days(name: str, meaning: str, default: int) -> Setting[int | None]:
    """A retention period: whole days from 1 to MAX_DAYS, or `never` (None: kept for good)."""

    def parse(raw: str) -> int | None:
        if raw.lower() == NEVER:
            return None
        return _whole_in(name, raw, 1, MAX_DAYS, also=f" or {NEVER!r}")

    shown = f"{default} (1 to {MAX_DAYS}, or never)"
    return Setting[int | None](name, default, shown, meaning, parse)


def port(name: str, meaning: str, default: int) -> Setting[int]:
    """A TCP port number."""

    def parse(raw: str) -> int:
        try:
            number = int(raw)
        except ValueError:
            raise ConfigurationError(f"{name} must be a whole number, not {raw!r}.") from None
        if not 1 <= number <= MAX_PORT:
            raise ConfigurationError(f"{name} must be between 1 and {MAX_PORT}, not {number}.")
        return number

    return Setting(name, default, str(default), meaning, parse)


def optional_port(name: str, meaning: str, *, shown: str = "unset") -> Setting[int | None]:
    """A TCP port number; None when unset."""
    parse = port(name, meaning, 1).parse
    return Setting[int | None](name, None, shown, meaning, parse)


def choice(name: str, meaning: str, words: tuple[str, ...], *, shown: str) -> Setting[str | None]:
    """One of `words` (in any case); None when unset."""

    def parse(raw: str) -> str:
        word = raw.lower()
        if word not in words:
            raise ConfigurationError(f"{name} must be one of {', '.join(words)}, not {raw!r}.")
        return word

    return Setting[str | None](name, None, shown, meaning, parse)


def seconds(
    name: str, meaning: str, default: float, *, least: float | None = None
) -> Setting[float]:
    """A finite number of seconds: at least `least`, or above 0 when `least` is None."""

    def parse(raw: str) -> float:
        try:
            number = float(raw)
        except ValueError:
            number = None
        if least is None:
            if number is None or not (number > 0 and math.isfinite(number)):
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds, not {raw!r}."
                )
        elif number is None:
            raise ConfigurationError(f"{name} must be a number of seconds, not {raw!r}.")
        elif not (number >= least and math.isfinite(number)):  # also refuses NaN
            raise ConfigurationError(f"{name} must be at least {least:g}, not {raw!r}.")
        return number

    shown = f"{default:g}" + (" (> 0)" if least is None else f" (>= {least:g})")
    return Setting(name, default, shown, meaning, parse)
