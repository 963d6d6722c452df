"""Bounded HTTP reads: every request has a deadline and a size cap.

A hung engine costs one timeout, an engine that streams an enormous body costs at most
`max_bytes`, and each failure comes back as a FetchError worded for the operator.

The client is aiohttp: measured here (bench/agent_cycle.py), the same probe requests
cost several times less CPU through aiohttp than through httpx, and the agent's cycle
budget is mostly its HTTP client.
"""

from __future__ import annotations

import asyncio
import errno
import json
from dataclasses import dataclass
from typing import Any

import aiohttp


class FetchError(Exception):
    """A request that did not produce a usable answer; str() says why, briefly.

    `refused` is True when nothing listens on the port (a stopped or still-loading
    server), as opposed to a server that answered badly or not in time.
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(slots=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise FetchError(f"answered with invalid JSON ({exc.__class__.__name__})") from None

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def new_session(limit: int = 64) -> aiohttp.ClientSession:
    """A session for bounded fetches; create it inside the running event loop."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, enable_cleanup_closed=True),
        trust_env=False,
    )


async def capped_body(
    resp: aiohttp.ClientResponse, max_bytes: int, chunk: int = 64 * 1024
) -> bytes | None:
    """The whole body, or None once it passes `max_bytes` (the rest is not read)."""
    body = bytearray()
    async for part in resp.content.iter_chunked(chunk):
        body += part
        if len(body) > max_bytes:
            return None
    return bytes(body)


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
) -> Response:
    """One GET, finished within `timeout` seconds and `max_bytes` of body."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url) as resp:
                declared = resp.content_length
                if declared is not None and declared > max_bytes:
                    raise FetchError(f"response too large ({declared} bytes > {max_bytes})")
                body = await capped_body(resp, max_bytes)
                if body is None:
                    raise FetchError(f"response too large (over {max_bytes} bytes)")
                return Response(resp.status, body)
    except TimeoutError:
        raise FetchError(f"no answer within {timeout:g} s") from None
    except aiohttp.ClientConnectorError as exc:
        if exc.os_error is not None and exc.os_error.errno == errno.ECONNREFUSED:
            raise FetchError("connection refused", refused=True) from None
        raise FetchError(f"cannot connect: {exc.os_error or exc}") from None
    except aiohttp.ClientError as exc:
        raise FetchError(f"{exc.__class__.__name__}: {exc}".rstrip(": ")[:200]) from None
