"""Every `DULY_*` environment variable duly reads: its default, its check and its meaning.

The one module that reads them from the environment. A `Setting` reads its
variable (from `os.environ`, or from a mapping a test gives) and answers a
typed value, or a `ConfigurationError` that names the variable and never
repeats a secret. `SETTINGS` lists them all; `python -m engine.base.settings`
prints the table README.md shows. It imports only the standard library.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from engine.base.errors import ConfigurationError

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
MIN_KEY_LENGTH = 16  # characters of a token or signing secret: a guessable key is refused


class RuleRefusal(ConfigurationError):
    """A value refused by a rule whose sentence shows no part of it (a secret's length)."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One `DULY_*` variable: how its text becomes a value, its default and what it means."""

    name: str
    default: T
    shown_default: str  # the default as README.md's table shows it
    meaning: str  # one line
    parse: Callable[[str], T] = field(repr=False, compare=False)
    secret: bool = False  # never repeated in a message
    exact: bool = False  # read as written: not stripped of surrounding spaces

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
    """A secret key, read as written; None when unset; at least MIN_KEY_LENGTH characters."""

    def parse(raw: str) -> str:
        if len(raw) < MIN_KEY_LENGTH:
            raise RuleRefusal(
                f"{name} must be at least {MIN_KEY_LENGTH} characters: a random key, such as "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))' prints."
            )
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


# -- the variables, by where they are read ---------------------------------------------------

# Every process.
APP = text("DULY_APP", "the module that maps the app's workflows and events", "functions.examples")
DATABASE_URL = optional_text(
    "DULY_DATABASE_URL",
    "the workflow database, postgresql://user:password@host:5432/dbname; unset, "
    "`duly dev` starts an embedded one",
    secret=True,
)
MODE = mode(
    "DULY_MODE", "`production` chooses the outbox and the durable engine by default; else local"
)
GC_TUNING = flag(
    "DULY_GC_TUNING", "a worker freezes what is loaded and collects young objects less often", True
)
STRANDED_AFTER_SECONDS = seconds(
    "DULY_STRANDED_AFTER_SECONDS",
    "a run due this long that no worker has taken is reported stranded",
    900.0,
)

# `duly dev`, `duly migrate`.
HOST = text("DULY_HOST", "the interface `duly dev` serves on", "127.0.0.1")
PORT = port("DULY_PORT", "the port `duly dev` serves on", 8000)
DATA_DIR = optional_text(
    "DULY_DATA_DIR",
    "where `duly dev` keeps the embedded PostgreSQL's data, so runs survive restarts",
    shown=".duly/pgdata",
)
MIGRATIONS = optional_text(
    "DULY_MIGRATIONS",
    "the app's Alembic revisions directory (duly's own serve functions.examples)",
)

# The event layer.
ASYNC = optional_flag(
    "DULY_ASYNC",
    "publish into the outbox, delivered after the commit, rather than inline",
    shown="on in production, else off",
)
DEAD_LETTER_ENABLED = flag(
    "DULY_DEAD_LETTER_ENABLED", "an event that fails its last retry goes to dead letter", True
)
SIGNAL_BRIDGE = flag("DULY_SIGNAL_BRIDGE", "publish the mapped models' changes as events", False)
EVENT_REGISTRY = optional_text(
    "DULY_EVENT_REGISTRY",
    'the event registry: a dotted path, or JSON {"class": ..., "options": {...}}',
    shown="by mode",
)
WORKFLOW_ENGINE = optional_text(
    "DULY_WORKFLOW_ENGINE", "the execution engine, named as DULY_EVENT_REGISTRY is", shown="by mode"
)
OUTBOX_BATCH_SIZE = lenient_whole(
    "DULY_OUTBOX_BATCH_SIZE", "outbox rows a drain claims at once", 100, least=1
)
OUTBOX_PROCESS_CHUNK_SIZE = lenient_whole(
    "DULY_OUTBOX_PROCESS_CHUNK_SIZE", "outbox rows routed a statement", 50, least=1
)
OUTBOX_CLAIM_TTL_SECONDS = lenient_whole(
    "DULY_OUTBOX_CLAIM_TTL_SECONDS", "how long a drain's claim of an outbox row lasts", 300, least=1
)
MAX_RETRIES = lenient_whole(
    "DULY_MAX_RETRIES", "failed routings of an event before it is dead-lettered", 3, least=0
)
RETRY_BACKOFF_SECONDS = lenient_whole(
    "DULY_RETRY_BACKOFF_SECONDS", "seconds, times the attempts so far, before a retry", 5, least=1
)
DELIVERY_RUNNING_TIMEOUT_SECONDS = lenient_whole(
    "DULY_DELIVERY_RUNNING_TIMEOUT_SECONDS", "how long one route's handlers may run", 300, least=1
)

# Retention.
RETAIN_ATTEMPTS_DAYS = days(
    "DULY_RETAIN_ATTEMPTS_DAYS", "days attempt-log rows are kept, from the attempt's end", 30
)
RETAIN_EVENTS_DAYS = days(
    "DULY_RETAIN_EVENTS_DAYS",
    "days processed outbox rows (and their records and deliveries) are kept",
    30,
)
RETAIN_EXECUTIONS_DAYS = days(
    "DULY_RETAIN_EXECUTIONS_DAYS", "days finished durable executions are kept", 30
)
PRUNE_BATCH_SIZE = whole(
    "DULY_PRUNE_BATCH_SIZE", "rows one prune batch deletes, in its own transaction", 5_000,
    least=1, most=MAX_PRUNE_BATCH_SIZE,
)  # fmt: skip
PRUNE_PAUSE_MS = whole(
    "DULY_PRUNE_PAUSE_MS", "milliseconds a prune pauses after a batch that deleted rows", 100,
    least=0, most=MAX_PAUSE_MS,
)  # fmt: skip
PRUNE_ON_DRAIN = flag("DULY_PRUNE_ON_DRAIN", "each drain ends with a bounded prune pass", False)
PRUNE_DRAIN_BATCHES = whole(
    "DULY_PRUNE_DRAIN_BATCHES", "batches a drain's prune pass makes at most, per table", 2, least=1
)

# The HTTP app.
API_TOKEN = key(
    "DULY_API_TOKEN", "an admin key: `Authorization: Bearer` this token (16 characters or more)"
)
WEBHOOK_SECRET = key(
    "DULY_WEBHOOK_SECRET",
    "requests may be signed instead: HMAC-SHA256 under this secret, as an operator (16 or more)",
)
MAX_BODY_BYTES = whole(
    "DULY_MAX_BODY_BYTES", "the largest request body, in bytes (larger is 413)", 1 << 20, least=1
)
BODY_TIMEOUT_SECONDS = seconds(
    "DULY_BODY_TIMEOUT_SECONDS", "how long a request body may take to arrive (then 408)", 10.0
)
ALLOWED_HOSTS = optional_text(
    "DULY_ALLOWED_HOSTS",
    "the `Host` names served, comma-separated (others are 421); `duly dev` serves its own",
    shown="any",
)

# Who is calling: principals and their roles (docs/architecture.md, "Who is acting").
API_KEYS = optional_text(
    "DULY_API_KEYS",
    "named API keys: a JSON list of {name, roles, groups, sha256}; `duly keys new` makes one",
)
ROLES = optional_text(
    "DULY_ROLES",
    'roles by user id, group or IAM ARN: a JSON object such as {"finance": ["operator"]}',
)
DEFAULT_ROLE = text(
    "DULY_DEFAULT_ROLE",
    "the role a token or IAM principal holds that no DULY_ROLES entry names (`none`: none)",
    "viewer",
)
METRICS_TOKEN = key(
    "DULY_METRICS_TOKEN", "a bearer token that may read /metrics only, for a scraper (16 or more)"
)
WEBHOOK_SECRETS = optional_text(
    "DULY_WEBHOOK_SECRETS",
    "signing secrets held to routes: a JSON list of {name, secret, routes}",
    secret=True,
    exact=True,
)
OIDC_ISSUER = optional_text(
    "DULY_OIDC_ISSUER", "an OpenID Connect issuer whose bearer JWTs name principals"
)
OIDC_AUDIENCE = optional_text(
    "DULY_OIDC_AUDIENCE", "the `aud` those tokens must carry (unset: DULY_OIDC_CLIENT_ID)"
)
OIDC_JWKS_URL = optional_text(
    "DULY_OIDC_JWKS_URL",
    "where the issuer's signing keys are (unset: its discovery document says)",
)
OIDC_USER_CLAIM = text(
    "DULY_OIDC_USER_CLAIM", "the claim that names the user (Cognito: `cognito:username`)", "sub"
)
OIDC_GROUPS_CLAIM = text(
    "DULY_OIDC_GROUPS_CLAIM",
    "the claim that lists the user's groups (Cognito: `cognito:groups`)",
    "groups",
)
OIDC_CLIENT_ID = optional_text(
    "DULY_OIDC_CLIENT_ID", "the console's OAuth client: logging in goes through the issuer"
)
OIDC_CLIENT_SECRET = optional_text(
    "DULY_OIDC_CLIENT_SECRET",
    "that client's secret, for issuers that give one (PKCE is used either way)",
    secret=True,
    exact=True,
)

# The AWS functions.
DATABASE_SECRET_ARN = optional_text(
    "DULY_DATABASE_SECRET_ARN",
    "without DULY_DATABASE_URL: the Secrets Manager secret of the database (RDS-managed or JSON)",
)
WAKE_FUNCTION_ARN = optional_text(
    "DULY_WAKE_FUNCTION_ARN", "the wake function: the schedule's target and what a kick invokes"
)
SCHEDULE_GROUP = optional_text(
    "DULY_SCHEDULE_GROUP", "the EventBridge Scheduler group of the deployment's schedule"
)
SCHEDULER_ROLE_ARN = optional_text(
    "DULY_SCHEDULER_ROLE_ARN", "the role the scheduler assumes to invoke the wake function"
)
MAX_WAKES = whole(
    "DULY_MAX_WAKES", "wake invocations at once at most: the wake function's concurrency", 4,
    least=1,
)  # fmt: skip
WAKE_MARGIN_SECONDS = seconds(
    "DULY_WAKE_MARGIN_SECONDS", "a wake stops claiming this long before its deadline", 10.0,
    least=1.0,
)  # fmt: skip
# Where the database is and how the functions log in: these win over the secret's fields.
DATABASE_HOST = optional_text(
    "DULY_DATABASE_HOST",
    "the database's host, over the secret's: an RDS Proxy's endpoint, or the instance of an "
    "RDS-managed secret (username and password only)",
)
DATABASE_PORT = optional_port(
    "DULY_DATABASE_PORT", "the database's port, over the secret's", shown="the secret's, or 5432"
)
DATABASE_NAME = optional_text(
    "DULY_DATABASE_NAME", "the database's name, over the secret's",
    shown="the secret's, or postgres",
)  # fmt: skip
DATABASE_USER = optional_text(
    "DULY_DATABASE_USER", shown="the secret's",
    meaning="the user to log in as, over the secret's (with IAM auth, a user granted `rds_iam`)",
)  # fmt: skip
DATABASE_IAM_AUTH = flag(
    "DULY_DATABASE_IAM_AUTH",
    "log in with an IAM token made afresh for each connection, never a password", False,
)  # fmt: skip
DATABASE_SSLMODE = choice(
    "DULY_DATABASE_SSLMODE",
    "libpq's sslmode for the AWS functions' connections",
    ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    shown="require with IAM auth, else libpq's",
)
DATABASE_SECRET_MAX_AGE_SECONDS = seconds(
    "DULY_DATABASE_SECRET_MAX_AGE_SECONDS",
    "a warm function reads the database secret again once its copy is this old", 900.0, least=1.0,
)  # fmt: skip
PUBLIC_URL = flag(
    "DULY_PUBLIC_URL",
    "this function's URL is public (auth type NONE): it serves nothing unless a credential is set",
    False,
)

# Tests and benchmarks.
TEST_DATABASE_URL = optional_text(
    "DULY_TEST_DATABASE_URL",
    "the pytest plugin's server to create test databases on; unset, an embedded one",
    secret=True,
)
TEST_MARKS = optional_text(
    "DULY_TEST_MARKS", "the folder where the test suite's chain app leaves its marks"
)
CHAOS_KEEP = flag("DULY_CHAOS_KEEP", "bench/chaos.py keeps the soak's database to look at", False)
SAM = optional_text(
    "DULY_SAM", "the `sam` the bundle test builds with (.ci/run installs one); unset: PATH's"
)
CHECKOV = optional_text("DULY_CHECKOV", "the `checkov` the template test runs; unset: PATH's")

# Every variable above, in the order declared (README's table follows it): a declaration is
# the one place a variable is named.
SETTINGS: tuple[Setting[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Setting)
)
BY_NAME: dict[str, Setting[Any]] = {setting.name: setting for setting in SETTINGS}


def markdown_table() -> str:
    """README.md's table of every variable: name, default and meaning."""
    lines = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    lines += [f"| `{s.name}` | {s.shown_default} | {s.meaning} |" for s in SETTINGS]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
