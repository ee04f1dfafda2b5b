"""The garbage collector, set once per process for a worker's steady stream of short objects.

A worker allocates a few dozen container objects per step (its row, its
claim, its write, the futures between them) and frees nearly all of them by
reference counting a moment later. CPython's defaults still run a young
collection every 700 net allocations, and now and then a full one that walks
every object the process holds: the imported modules, SQLAlchemy's mappers,
the app. Measured on the no-op and outbox benchmarks, collections took
7-22 us of a step's ~120-140 us of CPU, most of it in full collections.

`settle()` does two things, once per process, when the first worker starts:
it freezes what is alive then (everything imported and configured) into the
collector's permanent generation, so full collections skip it; and it raises
the young generation's threshold (700 to 7,000, only if nobody changed it),
so the objects of steps in flight are seldom scanned before they are freed.
Garbage in reference cycles is still collected, a little later. Set
`DULY_GC_TUNING=0` to leave the collector as it is.
"""

from __future__ import annotations

import gc

from engine.base.settings import GC_TUNING

SETTING = GC_TUNING.name
DEFAULT_YOUNG_THRESHOLD = 700  # CPython's own, left alone if an application set another
YOUNG_THRESHOLD = 7_000

_settled = False


def settle() -> bool:
    """Freeze the process's objects and collect young ones less often; once. Whether it did."""
    global _settled
    if _settled or not GC_TUNING.read():
        return False
    _settled = True
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young == DEFAULT_YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return True
