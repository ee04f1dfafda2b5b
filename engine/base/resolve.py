"""Objects named by a setting: an instance, a dotted path, a class or factory, or a mapping.

The event registry and the workflow engine are chosen the same way: an instance is used as
it is; a dotted path (`pkg.mod.name` or `pkg.mod:name`) is imported and then treated as
what it names; a class is instantiated and any other callable called as a zero-argument
factory; a mapping `{"class": ..., "options": {...}}` (or its JSON text, since an
environment variable is text) calls its class with the options as keyword arguments, other
keys ignored. Import, factory and constructor errors propagate; what comes out must be what
the caller accepts.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from engine.base.errors import ConfigurationError


def import_dotted(path: str) -> Any:
    """The object `pkg.mod.name` (or `pkg.mod:name`) names; ImportError when it cannot be found."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ImportError(f"{path!r} is not a dotted path to an object (pkg.module.name).")
    module = importlib.import_module(module_name)
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImportError(f"{module_name} has no {attribute!r} ({path!r}).") from None
    return target


def resolve_object(value: Any, *, accepts: Callable[[Any], bool], what: str) -> Any:
    """The object `value` names, checked by `accepts`; ConfigurationError if it is not one."""
    if isinstance(value, str):
        text = value.strip()
        value = _from_json(text, what) if text.startswith("{") else import_dotted(text)
    if isinstance(value, Mapping):
        value = _from_mapping(value, what)
    elif not accepts(value) and callable(value):
        value = value()  # a class or a zero-argument factory
    if not accepts(value):
        raise ConfigurationError(f"The {what} setting names {value!r}, which is not a {what}.")
    return value


def _from_json(text: str, what: str) -> Mapping[str, Any]:
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"The {what} setting is not valid JSON: {exc}.") from exc
    if not isinstance(loaded, Mapping):
        raise ConfigurationError(f"The {what} setting's JSON must be an object.")
    return loaded


def _from_mapping(value: Mapping[str, Any], what: str) -> Any:
    if "class" not in value:
        raise ConfigurationError(f"The {what} setting's mapping needs a 'class'.")
    cls = value["class"]
    if isinstance(cls, str):
        cls = import_dotted(cls.strip())
    options = value.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            f"The {what} setting's options must be a mapping, not {type(options).__name__}."
        )
    if not callable(cls):
        raise ConfigurationError(f"The {what} setting's class {cls!r} cannot be called.")
    return cls(**options)
