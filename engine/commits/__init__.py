"""Fenced writes of a step's outcome: the typed path and the bulk fast path."""
