"""The event layer: events, their routing to handlers, and named actions.

Users import these names from `engine`; the modules are private.
"""
