"""The fleet collector and the views built from it, shared by the TUI and `engineroom check`."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """Collect garbage far less often than CPython's default.

    The console decodes a snapshot per node per second (about 120 tracked objects each)
    and keeps it for a second: every young-generation collection rescans the snapshots
    still held, and promotes them for the older generations to scan again. At 1,000 nodes
    that cost 14 points of a core with a collection every 50,000 allocations and none at
    all with 400,000 (bench/console_scale.py: 66-70 % -> 52 %). Nearly all of it is freed
    by reference counting; the few cycles (Textual's caches) wait a little longer. Objects
    alive at start are frozen out of the scans."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(400_000, 100, 100)
