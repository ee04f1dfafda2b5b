"""Retention: what duly owns is deleted once past its period; the application's rows never are.

    settings = RetentionSettings.from_env()            # 30 days for each kind by default
    found = await count_prunable(connection, settings)  # the dry run: rows per table
    done = await prune(connection, settings)            # deletes them, a short transaction a batch

Pruned (`scans`): attempt-log rows, processed outbox rows with their event
records and delivery attempts, finished durable executions, and seen
signatures once expired (whatever the periods). Kept: every workflow table's
rows (the application's business data, finished or not), dead letters
(until replayed), and anything not finished.
"""

from __future__ import annotations

from engine.retention.pruning import Batch, PruneResult, TableRows, count_prunable, prune
from engine.retention.scans import Scan, prune_scans
from engine.retention.settings import KINDS, RetentionSettings

__all__ = [
    "KINDS",
    "Batch",
    "PruneResult",
    "RetentionSettings",
    "Scan",
    "TableRows",
    "count_prunable",
    "prune",
    "prune_scans",
]
