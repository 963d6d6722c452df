"""A lean HTTP/1.1 client for the gateway's pass-through: kept-alive connections per
upstream, the request written as one buffer, the response body handed on as it arrives.

The general clients (aiohttp's, httpx) build request objects, header multidicts and
stream readers per request; bench/gateway_overhead.py measured that path adding about
0.5 ms to TTFT at p50. The pass-through needs none of that: the body is forwarded as it
came, and only the status, the framing (Content-Length or chunked) and Connection matter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_HEADER = 64 * 1024
IDLE_PER_UPSTREAM = 64


class UpstreamError(Exception):
    """The upstream could not be reached or broke the protocol."""


@dataclass
class Response:
    status: int
    content_type: str
    _reader: asyncio.StreamReader
    _writer: asyncio.StreamWriter
    _pool: Pool
    _length: int | None
    _chunked: bool
    _reusable: bool
    _timeout: float
    _done: bool = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked framing removed); each read has the deadline."""
        reader, limit = self._reader, self._timeout
        if self._chunked:
            while True:
                async with asyncio.timeout(limit):
                    line = await reader.readline()
                    if not line.endswith(b"\n"):
                        raise UpstreamError("connection closed mid-body")
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        break
                    data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif self._length is not None:
            left = self._length
            while left > 0:
                async with asyncio.timeout(limit):
                    data = await reader.read(min(left, 65536))
                if not data:
                    raise UpstreamError("connection closed mid-body")
                left -= len(data)
                yield data
        else:  # until the upstream closes
            self._reusable = False
            while True:
                async with asyncio.timeout(limit):
                    data = await reader.read(65536)
                if not data:
                    break
                yield data
        self._done = True

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def release(self) -> None:
        """Back to the pool when the body was read whole, else closed."""
        if self._done and self._reusable:
            self._pool.give_back(self._reader, self._writer)
        else:
            self._writer.close()


@dataclass
class Pool:
    host: str
    port: int
    connect_timeout: float
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    @classmethod
    def for_url(cls, url: str, connect_timeout: float) -> Pool:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"{url}: the lean client speaks plain http only")
        return cls(parts.hostname or "127.0.0.1", parts.port or 80, connect_timeout)

    def give_back(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.idle) < IDLE_PER_UPSTREAM and not writer.is_closing():
            self.idle.append((reader, writer))
        else:
            writer.close()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            async with asyncio.timeout(self.connect_timeout):
                return await asyncio.open_connection(self.host, self.port, limit=2**20)
        except TimeoutError:
            raise UpstreamError(f"no connection within {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise UpstreamError(f"connection failed: {exc.strerror or exc}") from None

    async def post(self, path: str, body: bytes, timeout: float) -> Response:
        """Send a POST; return once the status and headers are in."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        # A kept-alive connection may have been closed by the upstream meanwhile: one
        # retry on a fresh connection, only when nothing of the answer came back.
        for attempt in range(2):
            fresh = not self.idle
            reader, writer = self.idle.pop() if self.idle else await self._connect()
            try:
                writer.write(head + body)
                async with asyncio.timeout(timeout):
                    raw = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                writer.close()
                if fresh or attempt:
                    raise UpstreamError(f"connection failed: {exc.__class__.__name__}") from None
                continue
            except asyncio.LimitOverrunError:
                writer.close()
                raise UpstreamError("response headers too large") from None
            except TimeoutError:
                writer.close()
                raise UpstreamError(f"no answer within {timeout:g} s") from None
            return self._parse(raw, reader, writer, timeout)
        raise UpstreamError("connection failed")

    def _parse(
        self,
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: float,
    ) -> Response:
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            writer.close()
            raise UpstreamError(f"not an HTTP answer: {lines[0][:80]!r}") from None
        length, chunked, reusable, ctype = None, False, True, "application/json"
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "content-length":
                with contextlib.suppress(ValueError):
                    length = int(value)
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif name == "connection":
                reusable = value.lower() != "close"
            elif name == "content-type":
                ctype = value.split(";", 1)[0].strip()
        if length is None and not chunked:
            reusable = False
        return Response(status, ctype, reader, writer, self, length, chunked, reusable, timeout)
