"""The garbage collector, set once per process for a worker's steady stream of short objects.

`settle()`, when the first worker starts, freezes what is alive then (everything imported
and configured) so full collections skip it, and raises the young generation's threshold
from 700 to 7,000 (only if nobody changed it). Cycles are still collected, a little later.
`DULY_GC_TUNING=0` leaves the collector alone. Why: docs/architecture.md, "Speed".
"""

from __future__ import annotations

import gc

from engine.base.settings import GC_TUNING

SETTING = GC_TUNING.name
DEFAULT_YOUNG_THRESHOLD = 700  # CPython's own, left alone if an application set another
YOUNG_THRESHOLD = 7_000

# The collector is the process's, so whether it was settled is too. A flag, not
# gc.get_freeze_count(): that walks every frozen object (tens of ms), on each worker's start.
_settled: set[str] = set()


def settle() -> bool:
    """Freeze the process's objects and collect young ones less often; once. Whether it did."""
    if _settled or not GC_TUNING.read():
        return False
    _settled.add("settled")
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young == DEFAULT_YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return True
