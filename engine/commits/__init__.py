"""Fenced writes of a step's outcome: the typed path and the fast path."""
