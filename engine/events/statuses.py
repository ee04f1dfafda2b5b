"""The statuses an outbox row and a delivery attempt are stored with.

Apart from the tables' modules, so that what only compares a status (the
Lambda metrics' dead letters) does not import the event layer.
"""

from __future__ import annotations

PENDING = "pending"
PROCESSED = "processed"
FAILED = "failed"
DEAD_LETTER = "dead_letter"
CLAIMED = "claimed"  # not stored: a pending or failed row whose claim is running
OUTBOX_STATUSES = (PENDING, PROCESSED, FAILED, DEAD_LETTER)

SUCCEEDED = "succeeded"
DELIVERY_STATUSES = (SUCCEEDED, FAILED, DEAD_LETTER)
STATUS_LENGTH = 16
