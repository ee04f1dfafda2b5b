"""Every `DULY_*` environment variable duly reads: its default, its check and its meaning.

The one module that reads them from the environment. A `Setting` reads its
variable (from `os.environ`, or from a mapping a test gives) and answers a
typed value, or a `ConfigurationError` that names the variable and never
repeats a secret. `SETTINGS` lists them all; `python -m engine.base.settings`
prints the table docs/reference/settings.md shows. It imports only the standard library.
"""

from __future__ import annotations

from typing import Any

from engine.base.setting_kinds import (
    FALSE_WORDS as FALSE_WORDS,
    LOCAL as LOCAL,
    MAX_DAYS as MAX_DAYS,
    MAX_PAUSE_MS as MAX_PAUSE_MS,
    MAX_PORT as MAX_PORT,
    MAX_PRUNE_BATCH_SIZE as MAX_PRUNE_BATCH_SIZE,
    NEVER as NEVER,
    PRODUCTION as PRODUCTION,
    TRUE_WORDS as TRUE_WORDS,
    RuleRefusal as RuleRefusal,
    Setting as Setting,
    choice as choice,
    days as days,
    flag as flag,
    key as key,
    lenient_whole as lenient_whole,
    mode as mode,
    optional_flag as optional_flag,
    optional_port as optional_port,
    optional_text as optional_text,
    port as port,
    seconds as seconds,
    text as text,
    whole as whole,
)

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
    "DULY_STRANDED_AFTER_SECONDS", "a run due this long that no worker has taken is reported "
    "stranded", 900.0,
)  # fmt: skip

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
    "roles by kinded name (user:ID, group:NAME, iam:ARN): a JSON object such as "
    '{"group:finance": ["operator"]}',
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
    "DULY_OIDC_USER_CLAIM",
    "the claim that names the user: one the issuer assigns (`sub`), never a name people pick",
    "sub",
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
    "DULY_DATABASE_HOST", "the database's host, over the secret's: an RDS Proxy's endpoint, or "
    "the instance of an RDS-managed secret (username and password only)",
)  # fmt: skip
DATABASE_PORT = optional_port(
    "DULY_DATABASE_PORT", "the database's port, over the secret's", shown="the secret's, or 5432"
)
DATABASE_NAME = optional_text(
    "DULY_DATABASE_NAME", "the database's name, over the secret's",
    shown="the secret's, or postgres",
)  # fmt: skip
DATABASE_USER = optional_text(
    "DULY_DATABASE_USER", "the user to log in as, over the secret's (with IAM auth, a user "
    "granted `rds_iam`)", shown="the secret's",
)  # fmt: skip
DATABASE_IAM_AUTH = flag(
    "DULY_DATABASE_IAM_AUTH", "log in with an IAM token made afresh for each connection, never a "
    "password", False,
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
DATABASE_PAUSES = flag(
    "DULY_DATABASE_PAUSES", "the database pauses while nobody is connected (Aurora Serverless v2 "
    "at 0 ACU, Neon): each invocation waits for a resume and closes its connections when done, "
    "and the server ends sessions idle a minute", False,
)  # fmt: skip
PUBLIC_URL = flag(
    "DULY_PUBLIC_URL", "this function's URL is public (auth type NONE): it serves nothing unless "
    "a credential is set, and trusts no `requestContext.authorizer`", False,
)  # fmt: skip
DIRECT_INVOKE_PRINCIPAL = Setting(
    "DULY_DIRECT_INVOKE_PRINCIPAL", "lambda:direct", "lambda:direct", "who a direct invoke of "
    "publish or deliver acts as in the audit trail (no payload names it)", str, most=200,
)  # fmt: skip

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
BUILT_SITE = optional_text(
    "DULY_BUILT_SITE",
    "the documentation site .ci/run built, which the site's tests read; unset: built",
)

# Every variable above, in the order declared (the settings reference follows it): a declaration is
# the one place a variable is named.
SETTINGS: tuple[Setting[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Setting)
)
BY_NAME: dict[str, Setting[Any]] = {setting.name: setting for setting in SETTINGS}


def markdown_table() -> str:
    """The settings reference's table of every variable: name, default and meaning."""
    lines = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    lines += [f"| `{s.name}` | {s.shown_default} | {s.meaning} |" for s in SETTINGS]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
