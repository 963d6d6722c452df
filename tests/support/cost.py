"""What a call cost the console: the peak of Python's traced memory while it ran, and the
time since it began (the bounded-answer tests of test_hardening_clients and test_ssh)."""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Cost:
    peak: int = 0  # bytes, the most Python held at once inside the block
    started: float = field(default_factory=time.monotonic)

    def took(self) -> float:
        """Seconds since the block began (read it after the clean-up it should count)."""
        return time.monotonic() - self.started


@contextlib.contextmanager
def traced() -> Iterator[Cost]:
    """Trace Python's allocations over the block; on the way out, its peak in the Cost."""
    tracemalloc.start()
    cost = Cost()
    try:
        yield cost
    finally:
        cost.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
