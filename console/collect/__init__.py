"""The fleet collector and the views built from it, shared by the TUI and `engineroom check`."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def tune_gc() -> None:
    """Collect garbage far less often than CPython's default.

    The console decodes a snapshot per node per second (about 120 tracked objects each)
    and keeps it for a second: every young-generation collection rescans the snapshots
    still held, and promotes them for the older generations to scan again. At 1,000 nodes
    that cost 14 points of a core with a collection every 50,000 allocations and none at
    all with 400,000 (bench/console_scale.py: 66-70 % -> 52 %). Nearly all of it is freed
    by reference counting; the few cycles (Textual's caches) wait a little longer.

    Objects alive now are collected, then frozen out of the scans. The full collection
    takes 54-68 ms (what the imports made): the console runs this once its sources have
    asked their first questions, while Prometheus or the agents answer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(400_000, 100, 100)


@contextmanager
def collection_paused() -> Iterator[None]:
    """No garbage collection inside; what is alive when it ends is frozen out of later
    scans. For a first look at a large fleet: making 10,000 nodes' snapshots and view
    parts wakes a young collection that scans the objects just made (65-75 ms of the
    first screen), and they live on for minutes (freed by reference counting as newer
    readings replace them). The cycles made inside, and any garbage waiting for a
    collection when it ends, stay until an unfreeze: once, for a console's first look."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
