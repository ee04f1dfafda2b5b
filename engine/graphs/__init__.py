"""Graph workflows: templates of states, conditions, forks and joins, run as branches.

Users import these names from `engine`; the modules are private.
"""
