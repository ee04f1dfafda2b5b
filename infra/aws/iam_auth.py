"""IAM database authentication: a token made afresh for each new connection, as its password.

The token is a SigV4-signed `connect` request that boto3 signs locally
(`rds.generate_db_auth_token`, no call to AWS), for the host, port and user
being connected to, and good for 15 minutes: a pooled connection outlives it,
but every connection the pool opens needs its own. SQLAlchemy's `do_connect`
event puts it in the connection's parameters just before psycopg connects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from engine import ConfigurationError

DEFAULT_PORT = 5432


def install_iam_auth(engine: AsyncEngine | Engine, rds_client: Callable[[], Any]) -> None:
    """Log `engine`'s every new connection in with a fresh IAM token; `rds_client` makes (or
    returns) the boto3 `rds` client that signs it, in the function's region."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine

    def with_fresh_token(
        dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]
    ) -> None:
        cparams["password"] = iam_token(rds_client(), cparams)

    event.listen(sync_engine, "do_connect", with_fresh_token)


def iam_token(client: Any, cparams: dict[str, Any]) -> str:
    """The token for the connection `cparams` describes (psycopg's host, port and user)."""
    host, user = cparams.get("host"), cparams.get("user")
    if not host or not user:
        raise ConfigurationError(
            "IAM database authentication signs a token for a host and a user: the "
            "database URL names no " + ("host" if not host else "user") + "."
        )
    token: str = client.generate_db_auth_token(
        DBHostname=str(host), Port=int(cparams.get("port") or DEFAULT_PORT), DBUsername=str(user)
    )
    return token
