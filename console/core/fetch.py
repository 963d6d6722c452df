"""Bounded HTTP reads: every request has a deadline and a size cap.

A hung engine costs one timeout, an engine that streams an enormous body costs at most
`max_bytes`, and each failure comes back as a FetchError worded for the operator.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx


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


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    method: str = "GET",
    json_body: Any = None,
) -> Response:
    """One request, finished within `timeout` seconds and `max_bytes` of body."""
    try:
        return await asyncio.wait_for(_read(client, method, url, max_bytes, json_body), timeout)
    except TimeoutError:
        raise FetchError(f"no answer within {timeout:g} s") from None
    except httpx.ConnectError:
        raise FetchError("connection refused", refused=True) from None
    except httpx.TimeoutException:
        raise FetchError(f"no answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"{exc.__class__.__name__}: {exc}".rstrip(": ")) from None


async def _read(
    client: httpx.AsyncClient, method: str, url: str, max_bytes: int, json_body: Any
) -> Response:
    async with client.stream(method, url, json=json_body) as resp:
        declared = resp.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise FetchError(f"response too large ({int(declared)} bytes > {max_bytes})")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise FetchError(f"response too large (over {max_bytes} bytes)")
            chunks.append(chunk)
        return Response(resp.status_code, b"".join(chunks))
