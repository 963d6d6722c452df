"""A poll that starts its next call only after the last one finished.

`set_interval` with an exclusive worker cancels a call still waiting when the next tick
comes: a gateway or agent slower than the interval was never shown. A Poll re-arms a
one-shot timer once each call ends instead, so a slow answer is shown when it comes and
calls never pile up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from textual.dom import DOMNode
from textual.timer import Timer


class Poll:
    """Calls `call` in a worker of `owner` now, then `every_s` after each call ended."""

    def __init__(
        self,
        owner: DOMNode,
        every_s: float,
        call: Callable[[], Awaitable[None]],
        group: str,
    ) -> None:
        self.owner, self.every_s, self.call, self.group = owner, every_s, call, group
        self._timer: Timer | None = None
        self._busy = False
        self._again = False  # asked for while a call was in flight: call again right after

    def now(self) -> None:
        """Poll now (right after the call in flight, if one is), then every `every_s`."""
        if self._busy:
            self._again = True
            return
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._busy = True
        self.owner.run_worker(self._once(), group=self.group)

    async def _once(self) -> None:
        try:
            await self.call()
        finally:
            self._busy = False
            again, self._again = self._again, False
            task = asyncio.current_task()
            # A worker is cancelled when its screen or the app closes: nothing to re-arm.
            if task is None or task.cancelling() == 0:
                self._rearm(again)

    def _rearm(self, again: bool) -> None:
        if not self.owner.is_running or self.owner._closing:
            return
        if again:  # now, through the owner's queue (a Timer of 0 s divides by zero)
            self.owner.call_later(self.now)
        else:
            self._timer = self.owner.set_timer(self.every_s, self.now, name=self.group)
