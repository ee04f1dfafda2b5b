"""The IAM caller of a Lambda Function URL whose auth type is AWS_IAM, as a principal.

Lambda checks the SigV4 signature before the function runs and puts the
caller in `requestContext.authorizer.iam`; mangum hands the event on as
`scope["aws.event"]`. DULY_ROLES names IAM callers as `iam:<arn>`: the
caller's ARN, an assumed role's ARN (so a role is granted to everyone who
assumes it), and the account's `arn:<partition>:iam::<id>:root`. Only the
`http` Lambda entry hands the app an event, and behind a public URL
(DULY_PUBLIC_URL) it drops the authorizer first: the direct entries refuse
HTTP events, so no payload a caller wrote names an IAM caller here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from functions.identity.principal import Principal, Via
from functions.identity.roles import IAM, RoleMap, kinded

# arn:aws:sts::<account>:assumed-role/<role name>/<session name>
ASSUMED_ROLE = re.compile(
    r"arn:(?P<partition>[\w-]+):sts::(?P<account>\d+):assumed-role/(?P<role>[^/]+)/"
)


def iam_caller(scope: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """`requestContext.authorizer.iam` of the Lambda event behind this request, if any."""
    event = scope.get("aws.event")
    if not isinstance(event, Mapping):
        return None
    context = event.get("requestContext")
    authorizer = context.get("authorizer") if isinstance(context, Mapping) else None
    iam = authorizer.get("iam") if isinstance(authorizer, Mapping) else None
    return iam if isinstance(iam, Mapping) and isinstance(iam.get("userArn"), str) else None


def iam_principal(caller: Mapping[str, Any], roles: RoleMap) -> Principal:
    """The principal of an IAM caller: its ARN, with its role's and its account's ARNs as
    groups; its roles are DULY_ROLES' `iam:` entries of any of the three."""
    arn: str = caller["userArn"]
    groups = set()
    partition = arn.split(":")[1] if arn.count(":") >= 5 else "aws"
    assumed = ASSUMED_ROLE.match(arn)
    if assumed is not None:
        partition, account, role = assumed.group("partition", "account", "role")
        groups.add(f"arn:{partition}:iam::{account}:role/{role}")
    account_id = caller.get("accountId")
    if isinstance(account_id, str) and account_id.isascii() and account_id.isdigit():
        groups.add(f"arn:{partition}:iam::{account_id}:root")
    names = [kinded(IAM, name) for name in (arn, *groups)]
    return Principal(id=arn, roles=roles.roles_for(names), via=Via.IAM, groups=frozenset(groups))
