"""A collector that replays recorded agent snapshots instead of polling.

For looking at real output again: the console renders snapshots that agents printed
(`engineroom agent --once --json`) exactly as it renders live ones. The screenshots of the
H200 evidence and the TUI's snapshot tests use it; the live path is `Collector`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from console.collect.collector import Collector
from console.core.config import Fleet
from console.core.wire import Snapshot


class ReplayCollector(Collector):
    """Nodes with a recording stay up with it; nodes recorded as None show as down."""

    def __init__(
        self, fleet: Fleet, snapshots: dict[str, Snapshot | None], history_points: int = 30
    ) -> None:
        super().__init__(fleet)
        self.recorded = snapshots
        for name, snap in snapshots.items():
            state = self.states[name]
            if snap is None:
                state.failures, state.error = 3, "connection refused"
                continue
            state.snapshot, state.last_ok = snap, time.monotonic()
            for _ in range(history_points):
                self.history.record(name, snap)
        self._keeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._keeper = asyncio.create_task(self._keep_fresh())

    async def _keep_fresh(self) -> None:
        while True:  # as if every refresh returned the recording again
            for name, snap in self.recorded.items():
                if snap is not None:
                    self.states[name].last_ok = time.monotonic()
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
