"""What the SIMULATED engine servers share: placeholder text, a Prometheus exposition
writer, serving an aiohttp app on given sockets, a request paced by its `Plan`, and SSE.

The servers themselves are `console.sim.vllm_engine.VllmEngine` and
`console.sim.triton_engine.TritonEngine`. Every number they show comes from the engine's
`Workload` (console.sim.load); versions end in "-sim", so nothing passes for a real engine.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from console.sim.load import Histogram, Plan, Workload

# Placeholder text: a simulated engine must never pass for a real one, even in its output.
_TEXT = (
    "This is a SIMULATED answer from the engineroom demo fleet; no model ran and no GPU "
    "was used. The tokens arrive at the pace the simulated engine would have produced "
    "them, so gateways, dashboards and alerts can be tried without hardware."
)
_WORDS = _TEXT.split(" ")


def words(n: int) -> list[str]:
    """`n` tokens of placeholder text, each with its leading space."""
    return [" " + _WORDS[i % len(_WORDS)] for i in range(n)]


def _num(value: float, integers: bool) -> str:
    # prometheus_client (vLLM) writes every value as a float ("8.0"); Triton's C++
    # exposer writes whole numbers without a fraction ("9").
    if integers and float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Exposition:
    """A Prometheus text exposition; each family's HELP and TYPE come from `families`."""

    def __init__(self, families: dict[str, tuple[str, str]], integers: bool = False) -> None:
        self.families = families  # name -> (type, help)
        self.integers = integers
        self.lines: list[str] = []
        self._seen: set[str] = set()

    def _header(self, family: str) -> None:
        if family not in self._seen:
            self._seen.add(family)
            kind, help_text = self.families.get(family, ("gauge", ""))
            self.lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}"]

    def add(self, name: str, labels: dict[str, str], value: float, family: str = "") -> None:
        self._header(family or name)
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        self.lines.append(f"{name}{{{inner}}} {_num(value, self.integers)}")

    def histogram(self, name: str, labels: dict[str, str], hist: Histogram) -> None:
        for bound, count in zip((*hist.bounds, None), hist.cumulative(), strict=True):
            le = "+Inf" if bound is None else _num(bound, self.integers)
            self.add(f"{name}_bucket", {**labels, "le": le}, count, family=name)
        self.add(f"{name}_count", labels, hist.count, family=name)
        self.add(f"{name}_sum", labels, hist.sum, family=name)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


async def serve(app: web.Application, socks: list[socket.socket]) -> web.AppRunner:
    # No access log (the demo prints nothing), and a short shutdown: streams are simulated.
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    for sock in socks:
        await web.SockSite(runner, sock, shutdown_timeout=1.0).start()
    return runner


class EngineRequest:
    """One request answered over HTTP: counted in the batch, and recorded when it ends."""

    def __init__(self, workload: Workload, plan: Plan) -> None:
        self.workload = workload
        self.plan = plan
        self.sent = 0
        self.reason = "abort"  # until it runs to its end

    def __enter__(self) -> EngineRequest:
        self.workload.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.workload.finish(self.plan, self.sent, self.reason)

    async def tokens(self) -> AsyncIterator[str]:
        """The answer's tokens, each at the time the simulated engine would send it: first
        the API server's share, which the engine's TTFT histogram does not see, then the
        engine's own time to first token."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.plan.api_s + self.plan.ttft_s)
        first = loop.time()
        for i, token in enumerate(words(self.plan.tokens)):
            if i:
                # On the engine's own clock: a late wake-up (a busy host) delays this token,
                # not every one after it, as a real engine's decode steps go on regardless.
                await asyncio.sleep(max(0.0, first + i * self.plan.itl_s - loop.time()))
            self.sent += 1
            yield token


async def send_sse(
    request: web.Request, events: AsyncIterator[dict[str, Any] | str]
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    try:
        async for event in events:
            data = event if isinstance(event, str) else json.dumps(event)
            await resp.write(f"data: {data}\n\n".encode())
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client left: the request is counted as aborted, as vLLM counts it
    return resp
