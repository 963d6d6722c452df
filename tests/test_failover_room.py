"""A failover target's room is read one way and said one way (console.gateway.failover.targetcheck):
"capacity: KV cache N%, queue M" from the engine's own metrics, or "capacity unknown:
<why>" when they cannot be read. Issue 28, defect 7: the same target read "capacity
unknown (no metrics)" once and "target KV cache 23 %" the next time. Real vLLM on
loopback; a port nothing listens on for the unknown."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from console.core.config.load import Deployment
from console.gateway.failover.targetcheck import room
from console.gateway.routing.measure import Measures
from console.gateway.routing.upstream import Upstream
from tests.engines.servers import free_port

pytestmark = pytest.mark.engines


def upstream(endpoint: str, engine: str = "vllm") -> Upstream:
    dep = Deployment(id="target", node="n", engine=engine, endpoint=endpoint)
    return Upstream("tiny", dep, Measures(60.0))


def read_room(target: Upstream) -> tuple[bool | None, str]:
    async def go() -> tuple[bool | None, str]:
        async with aiohttp.ClientSession(trust_env=False) as http:
            return await room(http, "tiny", target)

    return asyncio.run(go())


def test_a_readable_engine_s_room_is_said_the_same_way_every_time(vllm_server):
    seen = [read_room(upstream(vllm_server.base_url)) for _ in range(3)]
    for has_room, text in seen:
        assert has_room is True
        assert re.fullmatch(r"capacity: KV cache \d+%, queue \d+", text), text


def test_an_unreadable_engine_s_room_is_unknown_and_says_why():
    has_room, text = read_room(upstream(f"http://127.0.0.1:{free_port()}"))
    assert has_room is None  # unknown: neither room nor no room
    assert text.startswith("capacity unknown: "), text
    assert "0%" not in text  # never a 0 for what was not read
