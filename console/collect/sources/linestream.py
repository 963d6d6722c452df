"""An agent's snapshot stream (GET /v1/snapshot/stream), read straight off the socket.

At 1,000 nodes the console reads 1,000 snapshot lines a second. Through aiohttp each line
cost a parser callback, a StreamReader buffer and a task switch to the reader; here the
protocol splits the HTTP/1.1 body into lines in `data_received` and hands the newest
complete line to a callback at once, with no task in between (bench/console_scale.py).
Polls and every other request still go through the collector's aiohttp session.

What an agent may send is bounded: a head of at most MAX_HEAD bytes, chunk-size lines of
at most 64 bytes, and lines of at most `max_line` bytes (then the stream fails, naming
the cap, and nothing of that line is kept).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

from console.core.units import size_from_bytes

MAX_HEAD = 64 * 1024
_MAX_SIZE_LINE = 64

_tls: ssl.SSLContext | None = None


def _tls_context() -> ssl.SSLContext:
    global _tls
    if _tls is None:  # one for the fleet: each costs milliseconds and memory to make
        _tls = ssl.create_default_context()
    return _tls


class StreamError(Exception):
    """The stream failed; the message says why, for the node's row."""


class StreamStatus(StreamError):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class _LineProtocol(asyncio.Protocol):
    def __init__(self, on_line: Callable[[bytes], None], max_line: int) -> None:
        self.on_line = on_line
        self.max_line = max_line
        self.head: bytearray | None = bytearray()  # None once the head is read
        self.chunked = False
        self.raw = bytearray()  # chunked framing not yet decoded
        self.chunk_left = 0
        self.chunk_crlf = False  # the CRLF after a chunk's data is due
        self.last_chunk = False  # the zero-size chunk came: the stream ended
        self.pending = bytearray()  # body bytes after the last complete line
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(StreamError("the agent closed its snapshot stream"))

    def fail(self, error: Exception) -> None:
        self._end(error)
        if self.transport is not None:
            self.transport.abort()

    def _end(self, error: Exception) -> None:
        for future in (self.started, self.ended):
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: whoever awaits it reads it again

    def data_received(self, data: bytes) -> None:
        try:
            if self.head is not None:
                data = self._read_head(data)
                if not data:
                    return
            self._body(self._unchunk(data) if self.chunked else data)
            if self.last_chunk:  # after the lines that came with it
                raise StreamError("the agent closed its snapshot stream")
        except StreamError as exc:
            self.fail(exc)
        except Exception as exc:  # the callback's own failure (a bad snapshot) ends it too
            self.fail(exc)

    def _read_head(self, data: bytes) -> bytes:
        assert self.head is not None
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD:
                raise StreamError(f"an HTTP head over {MAX_HEAD >> 10} KiB")
            return b""
        head, rest = bytes(self.head[:end]), bytes(self.head[end + 4 :])
        self.head = None
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise StreamError(f"not an HTTP answer: {lines[0][:60]!r}")
        status = int(parts[1])
        if status != 200:
            raise StreamStatus(status)
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
        if not self.started.done():
            self.started.set_result(None)
        return rest

    def _unchunk(self, data: bytes) -> bytes:
        """The payload in `data` (and what was left over before it), framing removed."""
        raw = self.raw
        raw += data
        out = bytearray()
        while raw:
            if self.chunk_crlf:
                if len(raw) < 2:
                    break
                if raw[:2] != b"\r\n":
                    raise StreamError("bad chunked framing from the agent")
                del raw[:2]
                self.chunk_crlf = False
                continue
            if self.chunk_left == 0:
                end = raw.find(b"\r\n")
                if end < 0:
                    if len(raw) > _MAX_SIZE_LINE:
                        raise StreamError("bad chunked framing from the agent")
                    break
                size = raw[:end].split(b";", 1)[0].strip()
                # Hex digits only: int(size, 16) also reads "-5" (the payload read
                # backwards), "+5", "0x5" and "5_0".
                if not size or size.lstrip(b"0123456789abcdefABCDEF"):
                    raise StreamError("bad chunked framing from the agent")
                self.chunk_left = int(size, 16)
                del raw[: end + 2]
                if self.chunk_left == 0:
                    self.last_chunk = True
                    break
                continue
            take = min(self.chunk_left, len(raw))
            out += raw[:take]
            del raw[:take]
            self.chunk_left -= take
            self.chunk_crlf = self.chunk_left == 0
        return bytes(out)

    def _body(self, data: bytes) -> None:
        """Hand on the newest complete line: older ones waiting behind it are stale."""
        pending = self.pending
        pending += data
        end = pending.rfind(b"\n")
        if end < 0:
            if len(pending) > self.max_line:
                del pending[:]
                raise StreamError(f"snapshot larger than {size_from_bytes(self.max_line)}")
            return
        line = bytes(pending[pending.rfind(b"\n", 0, end) + 1 : end])
        del pending[: end + 1]
        if len(line) > self.max_line:
            raise StreamError(f"snapshot larger than {size_from_bytes(self.max_line)}")
        self.on_line(line)


class LineStream:
    """One open stream: `lines` calls back with each newest line until `ended` fails."""

    def __init__(self, protocol: _LineProtocol) -> None:
        self._protocol = protocol

    @property
    def ended(self) -> asyncio.Future[None]:
        return self._protocol.ended

    def close(self, why: Exception) -> None:
        self._protocol.fail(why)


async def open_stream(
    url: str,
    headers: dict[str, str],
    on_line: Callable[[bytes], None],
    *,
    max_line: int,
    timeout_s: float,
) -> LineStream:
    """Connect, send the GET and read the head within `timeout_s`; StreamStatus for an
    answer other than 200, StreamError or OSError when it cannot be read."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    loop = asyncio.get_running_loop()
    protocol = _LineProtocol(on_line, max_line)
    async with asyncio.timeout(timeout_s):
        transport, _ = await loop.create_connection(
            lambda: protocol,
            host,
            port,
            ssl=_tls_context() if tls else None,
            server_hostname=host if tls else None,
        )
        netloc = parts.netloc.rsplit("@", 1)[-1]
        request = [f"GET {target} HTTP/1.1", f"Host: {netloc}", "Accept: application/x-ndjson"]
        request += [f"{name}: {value}" for name, value in headers.items()]
        transport.write(("\r\n".join(request) + "\r\n\r\n").encode("latin-1"))
        try:
            await asyncio.shield(protocol.started)
        except BaseException:
            transport.abort()
            raise
    return LineStream(protocol)
