"""The fleet collector and the views built from it, shared by the TUI and `engineroom check`."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """Collect garbage less often: the console allocates a snapshot's worth of objects per
    node per second, and CPython's default (a collection every 700 allocations, with full
    scans of a heap that holds a thousand nodes' state) cost more CPU than the polling
    itself at 1,000 nodes (bench/console_scale.py: 49 % -> 26 % of a core for the
    collector). Objects alive at start are frozen out of the scans."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
