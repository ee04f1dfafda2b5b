"""Who acts on a graph instance: the user a move is for, and who made it on their behalf.

The engine takes user ids as given: the app's front doors decide who may
name whom (`functions.requests.graphs`). A plain user id is an `Actor` of
its own, with no groups beside the directory's and no one on its behalf.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    """The user a move, submit or cancel is for; their credential's groups; who acted for them.

    `groups` count toward a state's group assignees beside the directory's
    members (a token's groups claim, an API key's groups). `acted_by`, when
    set, is who acted in the user's stead (an admin): the history records both.
    `roles` are the front door's role words the caller holds, implied ones
    included: a template may let only a role submit.
    """

    user: str
    groups: frozenset[str] = frozenset()
    acted_by: str | None = None
    roles: frozenset[str] = frozenset()

    @classmethod
    def of(cls, who: str | Actor) -> Actor:
        """`who` as an Actor: a user id acts for itself."""
        return who if isinstance(who, Actor) else cls(user=who)

    @property
    def shown(self) -> str:
        """How a message names who acted: "mia", or "api-token on behalf of mia"."""
        return on_behalf(self.user, self.acted_by)


def on_behalf(user: str, acted_by: str | None) -> str:
    """`user`, or "`acted_by` on behalf of `user`" when someone else acted."""
    if acted_by is None or acted_by == user:
        return user
    return f"{acted_by} on behalf of {user}"
