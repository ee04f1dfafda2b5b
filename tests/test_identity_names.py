"""DULY_ROLES' names say their kind, and no key or user takes a name duly's own principals use.

- a user whose id is a group's name gains nothing from the group's entry; `user:` names a
  user, `group:` a groups claim's group: test_a_user_named_like_a_group_gains_nothing
- an IAM caller takes roles from `iam:` entries only (its ARN, its role's, its account's), and
  an issuer's group named like an ARN gains nothing: test_iam_callers_take_iam_entries_only
- an entry without its kind (or of another kind) is refused at configuration with a sentence
  showing the kinded form: test_an_unkinded_entry_is_refused_with_its_kinded_form
- a key named api-token, local or metrics (any case) is refused at configuration, and by
  `duly keys new`; an issuer's token naming such a user, a signer's (signed:) or an ARN is
  refused:
  test_the_names_of_dulys_own_principals_are_nobody_elses
"""

from __future__ import annotations

import json

import pytest

from engine.base.errors import ConfigurationError
from functions.cli.keys import new_entry
from functions.identity.iam import iam_principal
from functions.identity.keys import KeyRing, digest_of, new_key
from functions.identity.oidc import OidcSettings, OidcVerifier
from functions.identity.principal import Role
from functions.identity.roles import CredentialRefused, RoleMap
from tests.oidc_issuer import CLIENT_ID, LocalIssuer

ROLE_ARN = "arn:aws:iam::123456789012:role/ops"
SESSION_ARN = "arn:aws:sts::123456789012:assumed-role/ops/deploy-7"


def roles(table: dict[str, list[str]], default: str = "none") -> RoleMap:
    return RoleMap.from_env({"DULY_ROLES": json.dumps(table), "DULY_DEFAULT_ROLE": default})


def verifier(issuer: LocalIssuer, table: dict[str, list[str]]) -> OidcVerifier:
    settings = OidcSettings.from_env(
        {"DULY_OIDC_ISSUER": issuer.issuer, "DULY_OIDC_CLIENT_ID": CLIENT_ID}
    )
    assert settings is not None
    return OidcVerifier(settings, roles(table, default="viewer"))


async def test_a_user_named_like_a_group_gains_nothing(oidc_issuer: LocalIssuer) -> None:
    table = {"group:ops-admins": ["admin"], "user:mia": ["operator"]}
    checked = verifier(oidc_issuer, table)
    named_like = await checked.principal(oidc_issuer.mint("ops-admins"))
    assert named_like.roles == {Role.VIEWER}  # the default, not the group's admin
    member = await checked.principal(oidc_issuer.mint("u-7", ["ops-admins"]))
    assert member.has(Role.ADMIN)
    mia = await checked.principal(oidc_issuer.mint("mia"))
    assert mia.has(Role.OPERATOR) and not mia.has(Role.ADMIN)
    # A group named like a user is no user either.
    in_group_mia = await checked.principal(oidc_issuer.mint("u-8", ["mia"]))
    assert in_group_mia.roles == {Role.VIEWER}


def test_iam_callers_take_iam_entries_only() -> None:
    table = roles(
        {f"iam:{ROLE_ARN}": ["operator"], "iam:arn:aws:iam::999999999999:root": ["admin"]}
    )
    assumed = iam_principal({"userArn": SESSION_ARN, "accountId": "123456789012"}, table)
    assert assumed.has(Role.OPERATOR) and not assumed.has(Role.ADMIN)
    whole_account = iam_principal(
        {"userArn": "arn:aws:iam::999999999999:user/ci", "accountId": "999999999999"}, table
    )
    assert whole_account.has(Role.ADMIN)
    # The same ARN as a group or a user grants an IAM caller nothing, nor the IAM entry a
    # token whose groups claim names the ARN.
    elsewhere = roles({f"group:{ROLE_ARN}": ["admin"], f"user:{SESSION_ARN}": ["admin"]})
    assert iam_principal({"userArn": SESSION_ARN}, elsewhere).roles == frozenset()
    assert table.user_roles("u-1", [ROLE_ARN]) == frozenset()


def test_an_unkinded_entry_is_refused_with_its_kinded_form() -> None:
    with pytest.raises(ConfigurationError) as refused:
        roles({"finance": ["operator"]})
    assert '"group:finance" or "user:finance"' in str(refused.value)
    with pytest.raises(ConfigurationError, match=f'write "iam:{ROLE_ARN}"'):
        roles({ROLE_ARN: ["operator"]})
    for wrong in ("key:mia", "group:", "Group:ops", ":ops"):
        with pytest.raises(ConfigurationError, match="without its kind"):
            roles({wrong: ["viewer"]})


async def test_the_names_of_dulys_own_principals_are_nobody_elses(
    oidc_issuer: LocalIssuer,
) -> None:
    for name in ("api-token", "local", "metrics", "API-Token"):
        entry = {"name": name, "roles": ["viewer"], "sha256": digest_of(new_key())}
        with pytest.raises(ConfigurationError, match="a name duly's own principals act as"):
            KeyRing.from_env({"DULY_API_KEYS": json.dumps([entry])})
        with pytest.raises(ConfigurationError, match="name the key after its holder"):
            new_entry(name, ["viewer"], [])
    checked = verifier(oidc_issuer, {})
    for user in ("api-token", "signed:webhook", SESSION_ARN):
        with pytest.raises(CredentialRefused, match="a name duly keeps for its own principals"):
            await checked.principal(oidc_issuer.mint(user))
