"""A failover's verification window: what a deployment that gains traffic served after a
shift, and whether that meets the model's SLO.

A p95 needs enough requests to mean anything: over four requests it is the slowest of
them, and one slow request fails a healthy target (issue 28: fail-backs rolled back on one
request of a 10 % step). So a window judges at least MIN_SAMPLES requests: where the
traffic gave fewer, canaries straight to the target make up the rest, CANARIES_AT_ONCE at
a time. The data plane's own figures are used where it has them; a data plane that does
not see the canaries (HAProxy, the vLLM router: they go straight to the engine) gets
their outcomes added, and its latency comes from the engine's histograms, which do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from console.core.config.load import Slo
from console.core.units import ms_from_seconds
from console.gateway.dataplanes.base import BUILTIN, DataPlane, Figures
from console.gateway.routing.measure import nearest_rank

MIN_SAMPLES = 20  # requests a window's p95 is judged on; canaries make up what is missing
CANARIES_AT_ONCE = 4

# One canary straight to the target: (ok, TTFT in seconds, error).
Canary = Callable[[], Awaitable[tuple[bool, float | None, str | None]]]


async def window(
    plane: DataPlane, model: str, deployment: str, seconds: float, canary: Canary
) -> dict[str, Any]:
    """The verification window of `seconds` after a shift, for `deployment`: its figures
    (Figures.as_dict), over at least MIN_SAMPLES requests."""
    since = await plane.snapshot(model, deployment)
    await asyncio.sleep(seconds)
    figures = await plane.figures(model, deployment, since)
    short = MIN_SAMPLES - (figures.requests or 0)
    if short <= 0:
        return figures.as_dict()
    results = await canaries(canary, short)
    after = await plane.figures(model, deployment, since)
    failed = sum(1 for ok, _, _ in results if not ok)
    note = (
        f"{len(results)} canaries straight to the target "
        f"({figures.requests or 0} requests in the window)"
    )
    if plane.counts_canaries:  # they are in the data plane's own figures already
        return Figures(
            after.requests, after.failures, after.error_rate, after.ttft_p95_s,
            after.itl_p95_s, f"{after.source}; with {note}", after.failures_detail,
        ).as_dict()  # fmt: skip
    requests = (after.requests or 0) + len(results)
    failures = (after.failures or 0) + failed
    ttft = after.ttft_p95_s
    if ttft is None:  # the engine has no histogram: the canaries' own, nearest rank
        ttft = p95([t for ok, t, _ in results if ok and t is not None])
    return Figures(
        requests, failures, failures / requests if requests else None, ttft,
        after.itl_p95_s, f"{after.source}; with {note}", after.failures_detail,
    ).as_dict()  # fmt: skip


async def canaries(canary: Canary, count: int) -> list[tuple[bool, float | None, str | None]]:
    """`count` canaries, CANARIES_AT_ONCE at a time (each has its own deadline)."""
    gate = asyncio.Semaphore(CANARIES_AT_ONCE)

    async def one() -> tuple[bool, float | None, str | None]:
        async with gate:
            return await canary()

    return list(await asyncio.gather(*(one() for _ in range(count))))


def p95(values: list[float]) -> float | None:
    """The nearest-rank 95th percentile, as the gateway's measures take it; None for none."""
    return nearest_rank(sorted(values), 0.95) if values else None


def breach(figures: dict[str, Any], slo: Slo, default_error_rate: float) -> str | None:
    """Why `figures` break the SLO, in one line; None when they meet it (a figure that is
    unknown breaks nothing here: the window's source says what was read)."""
    limit = slo.error_rate if slo.error_rate is not None else default_error_rate
    if figures["error_rate"] is not None and figures["error_rate"] > limit:
        detail = figures.get("failures_detail")
        return f"error rate {figures['error_rate']:.1%} over {limit:.1%}" + (
            f" ({detail})" if detail else ""
        )
    ttft, itl = figures["ttft_p95_s"], figures["itl_p95_s"]
    if slo.ttft_p95_ms is not None and ttft is not None and ttft * 1000 > slo.ttft_p95_ms:
        return f"TTFT p95 {ms_from_seconds(ttft)} over {slo.ttft_p95_ms:g} ms"
    if slo.itl_p95_ms is not None and itl is not None and itl * 1000 > slo.itl_p95_ms:
        return f"ITL p95 {ms_from_seconds(itl)} over {slo.itl_p95_ms:g} ms"
    return None


def text(f: dict[str, Any]) -> str:
    """A window's figures in one line, for the job's step."""

    rate = "?" if f["error_rate"] is None else f"{f['error_rate']:.1%}"
    where = f" on {f['deployment']}" if f.get("deployment") else ""
    return (
        f"{f['requests']} requests{where}, errors {rate}, "
        f"TTFT p95 {ms_from_seconds(f['ttft_p95_s'])}, "
        f"ITL p95 {ms_from_seconds(f['itl_p95_s'])}"
    )


async def first_served(
    plane: DataPlane, model: str, deployment: str, before: int, timeout: float
) -> float | None:
    """When the data plane sent `deployment` its first request after a cutover
    (monotonic); None if none came within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = await plane.started(model, deployment)
        if now is not None and now > before:
            return time.monotonic()
        await asyncio.sleep(0.002 if plane.kind == BUILTIN else 0.01)
    return None
