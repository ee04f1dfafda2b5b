"""Named side effects: handlers call `actions.execute("send_email", ...)` instead of
scattering integration code.

An action is any object with `execute(context, params)` (plain or async) that
returns a result mapping or None. Names are exact strings, unique in one
registry; the registry trusts its type hints and does not inspect an action
until it runs.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from engine.base.errors import (
    ActionAlreadyRegisteredError,
    ActionExecutionError,
    ActionNotFoundError,
)


class Action(Protocol):
    """A named side effect."""

    def execute(
        self, context: Mapping[str, object], params: Mapping[str, object]
    ) -> Mapping[str, object] | Any | None:
        """Do the side effect; a result mapping, or None (may be awaitable)."""
        ...


class ActionRegistry:
    """The actions of this process, by exact name."""

    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}
        self._lock = threading.Lock()

    def register(self, name: str, action: Action, *, replace: bool = False) -> None:
        """Add `action` as `name`; a name already taken is an error unless `replace`."""
        with self._lock:
            if name in self._actions and not replace:
                raise ActionAlreadyRegisteredError(
                    f"An action named {name!r} is already registered: pass replace=True "
                    "to replace it."
                )
            self._actions[name] = action

    def get(self, name: str) -> Action:
        """The action registered as `name`."""
        with self._lock:
            try:
                return self._actions[name]
            except KeyError:
                raise ActionNotFoundError(f"No action is registered as {name!r}.") from None

    async def execute(
        self,
        name: str,
        *,
        context: Mapping[str, object] | None = None,
        params: Mapping[str, object] | None = None,
    ) -> Mapping[str, object] | None:
        """Run the action `name`; what it raises comes back as an ActionExecutionError.

        Missing context and params are fresh empty dicts; given mappings are
        passed as they are, empty ones included.
        """
        action = self.get(name)
        try:
            result = action.execute(
                {} if context is None else context, {} if params is None else params
            )
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            raise ActionExecutionError(f"The action {name!r} failed: {exc}") from exc
        return result

    def names(self) -> list[str]:
        """The registered names, sorted."""
        with self._lock:
            return sorted(self._actions)
