"""Is a deployment fit to take more of a model's traffic? What a failover's preflight (and
the plan screen, which asks for the same preflight) checks on every deployment that gains
traffic: it answers its health check, a canary completion through it meets the model's
TTFT SLO, and its engine has room by its own metrics (KV cache, queue).

The room is read one way, from one source (the engine's metrics through its plugin,
console.gateway.dataplanes.enginefigures), and said one way: "capacity: KV cache 23 %, queue 0", or
"capacity unknown: <why it could not be read>". A figure the engine does not give is "?",
never 0 (issue 28: the same target read "capacity unknown (no metrics)" once and "target
KV cache 23 %" the next time, when a slow answer cost the reading its deadline).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from console.core.config.load import Model
from console.core.units import ms_from_seconds
from console.gateway.dataplanes.enginefigures import probe_model
from console.gateway.http import triton_openai as tri
from console.gateway.routing.upstream import Upstream, check

KV_FULL = 0.9  # a target whose KV cache is fuller than this has no room
HEALTH_DEADLINE_S = 2.0
ROOM_DEADLINE_S = 5.0  # the engine's metrics (Triton's statistics are large)
CANARY_DEADLINE_S = 30.0


class NotFit(Exception):
    """The deployment may not take traffic now; str() says why, in one line."""


async def canary(
    http: aiohttp.ClientSession, target: Upstream, prompt: str, through_measures: bool = False
) -> tuple[bool, float | None, str | None]:
    """One small streaming completion straight to the target: (ok, TTFT, error). With
    `through_measures`, counted in the target's measures as a request the gateway relayed."""
    if target.kind == "triton":
        path, body = tri.request(
            {"prompt": prompt, "max_tokens": 4, "stream": True}, False, target.dep,
            target.engine_model,
        )  # fmt: skip
    else:
        path = "/v1/completions"
        body = {"model": target.engine_model, "prompt": prompt, "max_tokens": 4, "stream": True}
    started = time.perf_counter()
    ttft = None
    error: str | None = None
    try:
        async with (
            asyncio.timeout(CANARY_DEADLINE_S),
            http.post(target.dep.endpoint + path, json=body) as resp,
        ):
            if resp.status != 200:
                excerpt = await resp.content.read(200)  # not the whole: it may not end
                error = f"HTTP {resp.status}: {excerpt!r}"
            else:
                async for _ in resp.content.iter_any():
                    if ttft is None:
                        ttft = time.perf_counter() - started
    except (aiohttp.ClientError, TimeoutError) as exc:
        error = str(exc) or exc.__class__.__name__
    if error is None and ttft is None:
        error = "no answer"
    if through_measures:
        if ttft is not None and error is None:
            target.measures.ttft.add(ttft)
        target.measures.outcomes.add(error is None)
    return error is None, ttft, error


async def room(
    http: aiohttp.ClientSession, model: str, target: Upstream
) -> tuple[bool | None, str]:
    """(room? None: unknown; what was seen, in the words the plan uses every time)."""
    try:
        async with asyncio.timeout(ROOM_DEADLINE_S):
            reading, why = await probe_model(http, model, target.dep, ROOM_DEADLINE_S)
    except TimeoutError:
        reading, why = None, f"its metrics did not answer within {ROOM_DEADLINE_S:g} s"
    if reading is None:
        return None, f"capacity unknown: {why}"
    kv, waiting = reading.kv_cache_usage, reading.requests_waiting
    seen = "capacity: KV cache {}, queue {}".format(
        "?" if kv is None else f"{kv:.0%}", "?" if waiting is None else f"{waiting:g}"
    )
    if kv is not None and kv > KV_FULL:
        return False, f"{seen}: no room (KV cache over {KV_FULL:.0%})"
    return True if kv is not None else None, seen


async def fit(
    http: aiohttp.ClientSession, model: Model, target: Upstream, mark_up: bool
) -> tuple[float, str]:
    """The target's preflight: (canary TTFT, the room line). NotFit with why when it is
    not ready, its canary fails or misses the TTFT SLO, or it has no room. `mark_up`: a
    passed health check puts it back in the route table's pool (a job; a plan changes
    nothing)."""
    problem = await check(http, target, HEALTH_DEADLINE_S)
    if problem is not None:
        hint = (
            f"; it has launch profile {target.dep.profile}: start it first "
            f"(engineroom vllm start --node {target.dep.node} --profile {target.dep.profile})"
            if target.dep.profile
            else ""
        )
        raise NotFit(f"{target.id} is not ready: {problem}{hint}")
    if mark_up:
        target.mark_up()
    ok, ttft, error = await canary(http, target, model.failover.canary_prompt)
    if not ok or ttft is None:
        raise NotFit(f"the canary through {target.id} failed: {error}")
    limit = model.slo.ttft_p95_ms
    if limit is not None and ttft * 1000 > limit:
        raise NotFit(
            f"{target.id}: canary TTFT {ms_from_seconds(ttft)} is over the SLO ({limit:g} ms)"
        )
    has_room, seen = await room(http, model.name, target)
    if has_room is False:
        raise NotFit(f"{target.id}: {seen}")
    return ttft, seen
