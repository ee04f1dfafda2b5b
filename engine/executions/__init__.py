"""Execution engines: workflow definitions run in process, or (next) as durable rows.

Users import these names from `engine`; the modules are private.
"""
