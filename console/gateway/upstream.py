"""The gateway's view of one deployment: where it is, whether it is routable, how many
requests it has in flight, and what clients saw from it.

Health, two ways:
- active: every `health_interval_s` the engine's own health endpoint (vLLM and
  trtllm-serve `GET /health`; Triton `GET /v2/health/ready` and the model's ready);
- passive: a refused or reset connection marks it down at once; three 5xx answers within
  ten seconds too. An active check that passes brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from console.core.config import Deployment, Model
from console.gateway.measure import Measures

log = logging.getLogger(__name__)

FIVE_XX_BURST = 3
FIVE_XX_WINDOW_S = 10.0


@dataclass
class Upstream:
    model: str
    dep: Deployment
    measures: Measures
    up: bool = True  # routable as far as health goes; a first check confirms
    reason: str | None = None  # why it is down
    inflight: int = 0
    checked: float | None = None  # monotonic time of the last active check
    _errors: deque[float] = field(default_factory=deque)

    @property
    def id(self) -> str:
        return self.dep.id

    @property
    def kind(self) -> str:
        return self.dep.engine

    @property
    def engine_model(self) -> str:
        return self.dep.engine_model or self.model

    def mark_down(self, reason: str) -> bool:
        """Returns True when this changed its state (for auto failover and the audit)."""
        changed = self.up
        self.up, self.reason = False, reason
        if changed:
            log.warning("deployment %s down: %s", self.id, reason)
        return changed

    def mark_up(self) -> None:
        if not self.up:
            log.warning("deployment %s up again", self.id)
        self.up, self.reason = True, None
        self._errors.clear()

    def server_error(self, status: int) -> bool:
        now = time.monotonic()
        self._errors.append(now)
        while self._errors and self._errors[0] < now - FIVE_XX_WINDOW_S:
            self._errors.popleft()
        if len(self._errors) >= FIVE_XX_BURST:
            return self.mark_down(f"{len(self._errors)} answers of HTTP 5xx within 10 s")
        return False

    def health_urls(self) -> list[str]:
        base = self.dep.endpoint
        if self.kind == "triton":
            return [f"{base}/v2/health/ready", f"{base}/v2/models/{self.engine_model}/ready"]
        return [f"{base}/health"]


def build_upstreams(models: list[Model], window_s: float) -> dict[str, list[Upstream]]:
    return {
        m.name: [Upstream(m.name, d, Measures(window_s)) for d in m.deployments] for m in models
    }


async def check(http: aiohttp.ClientSession, upstream: Upstream, timeout: float) -> str | None:
    """None when healthy, else why not."""
    for url in upstream.health_urls():
        try:
            async with asyncio.timeout(timeout), http.get(url) as resp:
                await resp.read()
                if resp.status != 200:
                    return f"{url.rsplit('/', 2)[-2:][-1]} answered HTTP {resp.status}"
        except TimeoutError:
            return f"health check: no answer within {timeout:g} s"
        except aiohttp.ClientConnectorError:
            return "health check: connection refused"
        except aiohttp.ClientError as exc:
            return f"health check: {exc.__class__.__name__}"
    return None


async def health_loop(
    http: aiohttp.ClientSession,
    upstreams: Callable[[], list[Upstream]],
    interval: float,
    timeout: float,
    on_change: Callable[[Upstream], None],
) -> None:
    """Check every deployment every `interval` s, concurrently; report state changes."""
    while True:
        started = time.monotonic()
        current = upstreams()
        results = await asyncio.gather(
            *(check(http, u, timeout) for u in current), return_exceptions=True
        )
        for upstream, result in zip(current, results, strict=True):
            upstream.checked = time.monotonic()
            if isinstance(result, BaseException):
                result = f"health check failed: {result!r}"[:200]
            was = upstream.up
            if result is None:
                upstream.mark_up()
            else:
                upstream.mark_down(result)
            if upstream.up != was:
                with contextlib.suppress(Exception):
                    on_change(upstream)
        await asyncio.sleep(max(0.05, interval - (time.monotonic() - started)))
