"""Who is in a group: the pluggable directory graph workflows ask.

Users and groups are opaque ids. `StaticDirectory` holds a mapping; an
application plugs in its own (LDAP, its users table) with the same method.
The acting person's own groups (their credential's) count beside it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Protocol, runtime_checkable

from engine.graphs.moves.actors import Actor


@runtime_checkable
class Directory(Protocol):
    """Answers a group's members."""

    async def members(self, group: str) -> Collection[str]:
        """The user ids in `group` (empty for a group it does not know)."""
        ...


class StaticDirectory:
    """A directory from a mapping of group id to user ids."""

    def __init__(self, groups: Mapping[str, Iterable[str]] | None = None) -> None:
        self._groups = {group: frozenset(users) for group, users in (groups or {}).items()}

    async def members(self, group: str) -> Collection[str]:
        """The user ids in `group`."""
        return self._groups.get(group, frozenset())


async def effective_assignees(
    directory: Directory,
    users: Iterable[str],
    groups: Collection[str],
    acting: Actor | None = None,
) -> list[str]:
    """The named users and every member of the named groups, each once, in a stable order.

    The `acting` person is one of them, last, when their credential's groups
    hold one of the named groups, whether or not the directory knows it.
    """
    found = dict.fromkeys(users)
    for group in groups:
        found.update(dict.fromkeys(sorted(await directory.members(group))))
    return admitted(list(found), groups, acting)


def admitted(listed: list[str], groups: Collection[str], acting: Actor | None) -> list[str]:
    """The directory's `listed` assignees, and `acting` last when their credential's groups
    hold one of the state's `groups` though the directory does not list them."""
    if acting is None or acting.user in listed or acting.groups.isdisjoint(groups):
        return listed
    return [*listed, acting.user]
