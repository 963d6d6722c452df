"""Blocking calls the agent must not wait on forever: NVML and disk statistics.

A hung GPU driver can block an NVML call for minutes, and a hung NFS mount blocks
`statvfs` just as long. Each such call runs on its own thread with a deadline. While a
call still hangs, later cycles do not queue another behind it: they get the last good
value back, with a sentence saying so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class Watched(Generic[T]):
    def __init__(
        self, name: str, what: str, fn: Callable[[], T], deadline_s: float, initial: T
    ) -> None:
        self.name = name  # "NVML"
        self.what = what  # "GPU values"
        self.fn = fn
        self.deadline_s = deadline_s
        self.last = initial
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: concurrent.futures.Future[T] | None = None

    async def call(self) -> tuple[T, str | None, float | None]:
        """(value, problem, milliseconds): problem is None when this call answered in time."""
        if self._pending is not None and not self._pending.done():
            return (
                self.last,
                (
                    f"{self.name} is not answering (a call has hung); "
                    f"{self.what} are from the last good sample"
                ),
                None,
            )
        started = time.perf_counter()
        self._pending = self._pool.submit(self.fn)
        try:
            value = await asyncio.wait_for(asyncio.wrap_future(self._pending), self.deadline_s)
        except TimeoutError:
            return (
                self.last,
                (
                    f"{self.name} did not answer within {self.deadline_s:g} s; "
                    f"{self.what} are from the last good sample"
                ),
                None,
            )
        except Exception as exc:
            log.exception("%s failed", self.name)
            return self.last, f"{self.name} sample failed: {exc}", None
        self.last = value
        return value, None, round((time.perf_counter() - started) * 1000, 3)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
