"""A Function URL that AWS does not authenticate never serves everyone as the admin.

With no credential configured the guard lets every request act as the local
admin (local development); behind an AWS_IAM Function URL AWS has checked the
caller first, but behind one of auth type NONE nobody has. A function marked
DULY_PUBLIC_URL (the template's console function) refuses to build its HTTP
app then, so a deployment that forgot its keys is closed, not open; and since
AWS checked nobody there, an event's `requestContext.authorizer` is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import ConfigurationError, settings as variables


def refuse_an_open_public_url(environ: Mapping[str, str] | None = None) -> None:
    """Raise a ConfigurationError when DULY_PUBLIC_URL is on and no credential is configured."""
    if not variables.PUBLIC_URL.read(environ):
        return
    from functions.http.guard import GuardSettings

    if GuardSettings.from_env(environ).open:
        raise ConfigurationError(
            f"{variables.PUBLIC_URL.name} is on, so anyone on the internet reaches this "
            "function, and no credential is configured, so each of them would act as the "
            f"admin: set {variables.API_KEYS.name}, {variables.OIDC_ISSUER.name}, "
            f"{variables.API_TOKEN.name} or {variables.WEBHOOK_SECRET.name}."
        )


def checked_by_aws(
    event: dict[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`event` as the app may read it: without `requestContext.authorizer` when DULY_PUBLIC_URL
    is on (whoever sent it named that caller, AWS did not), else as it came."""
    context = event.get("requestContext")
    if not variables.PUBLIC_URL.read(environ) or not isinstance(context, dict):
        return event
    unchecked = {key: value for key, value in context.items() if key != "authorizer"}
    return {**event, "requestContext": unchecked}
