"""Named condition predicates, registered in Python: what a condition node asks.

A stored graph names its predicates; the code behind a name is registered
here, never text read from the database. A predicate gets the subject row
(or None) and the instance as a mapping, and answers True or False:

    @conditions.predicate("amount_over_1000")
    def large(subject: Expense, instance: Mapping[str, Any]) -> bool: ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.base.errors import ConfigurationError, NotFoundError

Predicate = Callable[[Any, Mapping[str, Any]], bool]


class ConditionRegistry:
    """Predicates by name; a name is registered once."""

    def __init__(self) -> None:
        self._predicates: dict[str, Predicate] = {}

    def register(self, name: str, predicate: Predicate) -> None:
        """Register `predicate` under `name` (a second registration of the name is refused)."""
        if not name or not name.strip():
            raise ConfigurationError("A condition predicate needs a name.")
        existing = self._predicates.get(name)
        if existing is not None and existing is not predicate:
            raise ConfigurationError(f"A condition predicate named {name!r} is registered.")
        self._predicates[name] = predicate

    def predicate(self, name: str) -> Callable[[Predicate], Predicate]:
        """Decorator: register the function under `name`."""

        def decorate(function: Predicate) -> Predicate:
            self.register(name, function)
            return function

        return decorate

    def names(self) -> frozenset[str]:
        """Every registered name."""
        return frozenset(self._predicates)

    def __contains__(self, name: object) -> bool:
        return name in self._predicates

    def evaluate(self, name: str, subject: Any, instance: Mapping[str, Any]) -> bool:
        """The predicate's answer, as a bool."""
        predicate = self._predicates.get(name)
        if predicate is None:
            raise NotFoundError(f"No condition predicate is registered as {name!r}.")
        return bool(predicate(subject, instance))
