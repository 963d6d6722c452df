"""The data path's HTTP/1.1 server: FrontDoor, one asyncio protocol per client connection.

It serves `POST /v1/completions` and `/v1/chat/completions` with a Content-Length body
itself: the head split in Python, the answer written straight to the socket, the SSE head
in the same packet as the first chunk. Anything else (the admin API, `/v1/models`, a
chunked or oversized upload, `Expect`, HTTP/1.0, an odd head) is handed, connection and
unread bytes, to aiohttp, which serves the rest of the gateway. aiohttp's server costs
~0.3 ms of Python per request, over the whole budget (docs/gateway.md, Figures).

Bounds, with their [gateway] settings (docs/security.md):
- `head_timeout_s`: a connection's next request must be in, head and body, within it of
  the connection's start or its last answer; aiohttp gets the same as its keep-alive
  timeout, which closes a handed-over connection whose next head is not in by then;
- `write_timeout_s`: a client that takes no byte of its answer for that long, while its
  socket is full, is cut;
- `max_connections`: past it a new connection gets a 503 and is closed;
- a head over MAX_HEAD bytes gets a 431, a head line with a bare CR or LF or a NUL a 400,
  on any route (aiohttp sees only heads within both bounds).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import struct
import termios
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

from console.gateway.context import GatewayContext
from console.gateway.http.sink import (
    SERVED_BY,
    SSE_HEADERS,
    ClientGone,
    ClientStalled,
    Sink,
    error_body,
    send_error,
)

log = logging.getLogger(__name__)

FAST = {b"/v1/completions": False, b"/v1/chat/completions": True}  # path: chat
MAX_HEAD = 16384
SHUTDOWN_GRACE_S = 10.0


class FrontDoor(asyncio.Protocol):
    """One client connection of the data path (this module's docstring)."""

    def __init__(self, gateway: GatewayContext, fallback: Callable[[], asyncio.Protocol]) -> None:
        self.gw = gateway
        self.fallback = fallback
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.writable: asyncio.Future[None] | None = None  # set while the socket is full
        # The next request's deadline: one timer, moved on only when it fires (a timer
        # made and cancelled per request costs more than the rest of its head's handling).
        self.idle: asyncio.TimerHandle | None = None
        self.idle_since = 0.0  # loop time of the connection's start or its last answer
        self.stall: asyncio.TimerHandle | None = None  # the full socket's deadline
        self.stalled = False
        self.unsent = 0  # bytes waiting to be sent when the stall deadline was last set
        # A head read and accepted whose body is not all in yet (a client often sends the
        # two apart): (where its body starts, its length, chat, close); not parsed again.
        self.waiting: tuple[int, int, bool, bool] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if self.gw.open_connections() >= self.gw.settings.max_connections:
            self.gw.connection_refused()
            cap = self.gw.settings.max_connections
            message = f"the gateway is at max_connections ({cap}); try again shortly"
            return self._answer_and_close(503, message, "server_error")
        self.gw.front_doors.add(self)
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._next()
        elif len(self.buf) > MAX_HEAD and self.transport is not None:
            self.transport.pause_reading()  # a client sending ahead while it is answered

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.gw.front_doors.discard(self)
        for timer in (self.idle, self.stall):
            if timer is not None:
                timer.cancel()
        # An answer in flight is not cancelled (nor is it by aiohttp): its next write finds
        # the client gone and closes the upstream connection, which stops the engine; an
        # answer the client read to its end is counted as served.
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()
        self._watch_stall()

    def resume_writing(self) -> None:
        closing = self.transport is None or self.transport.is_closing()
        if self.stall is not None and not closing:  # a closing one keeps its deadline
            self.stall.cancel()
            self.stall = None
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    def _watch_stall(self) -> None:
        if self.transport is not None and self.stall is None:
            self.unsent = unsent(self.transport)
            loop = asyncio.get_running_loop()
            self.stall = loop.call_later(self.gw.settings.write_timeout_s, self._check_stall)

    def _check_stall(self) -> None:
        """write_timeout_s after the socket filled: cut the client if it took nothing since."""
        self.stall = None
        transport = self.transport
        if transport is None:
            return
        if unsent(transport) < self.unsent:  # slow, but reading
            return self._watch_stall()
        self.stalled = True
        transport.abort()  # its unsent bytes are dropped: the client took none

    def gone(self) -> ClientGone:
        """Why the connection is no longer there to write to."""
        return ClientStalled() if self.stalled else ClientGone()

    def _wait_idle(self) -> None:
        if self.transport is None:
            return
        loop = asyncio.get_running_loop()
        self.idle_since = loop.time()
        if self.idle is None:
            self.idle = loop.call_at(self.idle_since + self.gw.settings.head_timeout_s, self._idle)

    def _idle(self) -> None:
        """head_timeout_s after the connection's start or last answer, unless a request is
        being answered: close."""
        loop = asyncio.get_running_loop()
        timeout = self.gw.settings.head_timeout_s
        if self.task is not None:  # no deadline while answering; one after it
            self.idle = loop.call_at(loop.time() + timeout, self._idle)
        elif loop.time() < self.idle_since + timeout:
            self.idle = loop.call_at(self.idle_since + timeout, self._idle)
        else:
            self.idle = None
            self._close()

    def _close(self) -> None:
        """Close once what was written is sent; a client that takes none of it within
        write_timeout_s is cut (a closing transport otherwise waits for it forever)."""
        transport = self.transport
        if transport is None:
            return
        transport.close()
        if transport.get_write_buffer_size():
            self._watch_stall()

    def _answer_and_close(
        self, status: int, message: str, kind: str, code: str | None = None
    ) -> None:
        """An answer given before a request is served (a refused connection, a bad head, a
        wrong key), then the connection closed: what is left of the request is not read."""
        if self.transport is None:
            return
        body = error_body(message, kind, code)
        fields = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.transport.write(_response_head(status, fields, close=True) + body)
        self.buf.clear()
        self._close()

    def _next(self) -> None:
        """Start on the next request in the buffer, once its head and body are in."""
        if self.waiting is not None:
            return self._start(*self.waiting)
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end > MAX_HEAD or (end < 0 and len(buf) > MAX_HEAD):
            too_long = f"the request head is over {MAX_HEAD} bytes"
            return self._answer_and_close(431, too_long, "invalid_request_error")
        if end < 0:
            return
        head = bytes(buf[:end])
        crlf = head.count(b"\r\n")
        if head.count(b"\r") != crlf or head.count(b"\n") != crlf or b"\0" in head:
            return self._answer_and_close(400, _bad_line(head), "invalid_request_error")
        lines = head.split(b"\r\n")
        method, _, rest = lines[0].partition(b" ")
        target, _, version = rest.partition(b" ")
        chat = FAST.get(target)
        if method != b"POST" or chat is None or version != b"HTTP/1.1":
            return self._hand_over()
        length, auth, close = -1, None, False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or name[-1:] in (b" ", b"\t") or line[:1] in (b" ", b"\t"):
                return self._hand_over()  # aiohttp answers malformed heads
            name, value = name.lower(), value.strip()
            if name == b"content-length":
                if length >= 0 or not value.isdigit():
                    return self._hand_over()
                # Past 18 digits it is over any cap (and int() refuses 4,300 digits).
                length = int(value) if len(value) <= 18 else 10**18
            elif name in (b"transfer-encoding", b"expect", b"upgrade"):
                return self._hand_over()
            elif name == b"authorization":
                auth = value.decode("latin-1")
            elif name == b"connection":
                close = b"close" in value.lower()
        if not 0 <= length <= self.gw.settings.max_body_bytes:
            return self._hand_over()
        if not self.gw.client_ok(auth):  # before the body: a stranger's upload is not held
            key = "invalid_api_key"
            return self._answer_and_close(401, "invalid API key", "invalid_request_error", key)
        self._start(end + 4, length, chat, close)

    def _start(self, start: int, length: int, chat: bool, close: bool) -> None:
        """Serve the request whose head was read, once its body is in."""
        buf = self.buf
        total = start + length
        if len(buf) < total:
            self.waiting = (start, length, chat, close)
            return
        self.waiting = None
        body = bytes(buf[start:total])
        del buf[:total]
        self.task = asyncio.get_running_loop().create_task(self._serve(body, chat, close))

    def _hand_over(self) -> None:
        """Give the connection to aiohttp, whose keep-alive timeout is head_timeout_s."""
        transport = self.transport
        if transport is None:
            return
        for timer in (self.idle, self.stall):
            if timer is not None:
                timer.cancel()
        self.idle = self.stall = None
        self.gw.front_doors.discard(self)
        protocol = self.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self.writable is not None:  # the socket is still full from the last answer
            protocol.pause_writing()
        transport.resume_reading()
        data, self.buf = bytes(self.buf), bytearray()
        protocol.data_received(data)

    async def _serve(self, body: bytes, chat: bool, close: bool) -> None:
        sink = RawSink(self, close)
        try:
            await self.gw.answer(body, chat, sink)  # a client that left is counted there
        except Exception:
            log.exception("the gateway failed on a request")
            if not sink.started:
                with contextlib.suppress(ClientGone):
                    await send_error(sink, 500, "the gateway failed; see its log", "server_error")
            close = True
        finally:
            self.task = None
        transport = self.transport
        if transport is None:
            return
        if close or sink.close:
            self._close()
            return
        self._wait_idle()
        transport.resume_reading()
        if self.buf:
            self._next()

    async def drain(self) -> None:
        if self.writable is not None:
            await self.writable
        if self.transport is None or self.transport.is_closing():
            raise self.gone()


class RawSink(Sink):
    """An answer written straight to a FrontDoor connection."""

    def __init__(self, door: FrontDoor, close: bool) -> None:
        self.door = door
        self.close = close
        self.started = False
        self.head = b""  # a stream's head, sent with its first chunk
        self.ended = False  # the stream's end was written (with its last chunk)

    def _head(self, status: int, fields: str) -> bytes:
        self.started = True
        return _response_head(status, fields, self.close)

    def _send(self, data: bytes) -> None:
        transport = self.door.transport
        if transport is None or transport.is_closing():
            raise self.door.gone()
        transport.write(data)

    async def reply(
        self, status: int, body: bytes, content_type: str, served_by: str | None
    ) -> None:
        fields = f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        if served_by is not None:
            fields += f"{SERVED_BY}: {served_by}\r\n"
        self._send(self._head(status, fields) + body)
        await self.door.drain()

    async def open_stream(self, served_by: str) -> None:
        self.open_now(served_by)

    def open_now(self, served_by: str) -> bool:
        if not self.started:
            self.head = self._head(200, f"{_SSE_FIELDS}{SERVED_BY}: {served_by}\r\n")
        return True

    async def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._send(b"%s%x\r\n%s\r\n" % (self.head, len(chunk), chunk))
        self.head = b""
        if self.door.writable is not None:
            await self.door.drain()

    def write_now(self, chunk: bytes, last: bool) -> bool:
        transport = self.door.transport
        if self.door.writable is not None or transport is None or transport.is_closing():
            return False
        data = b"%s%x\r\n%s\r\n" % (self.head, len(chunk), chunk) if chunk else self.head
        if last:
            data += b"0\r\n\r\n"
            self.ended = True
        self.head = b""
        transport.write(data)
        return True

    async def close_stream(self) -> None:
        if self.ended:  # written with the last chunk
            return
        self._send(self.head + b"0\r\n\r\n")
        self.head = b""


_OUTQ = getattr(termios, "TIOCOUTQ", None)  # Linux: bytes in a socket's send queue


def unsent(transport: asyncio.BaseTransport) -> int:
    """Bytes written to a client and not yet taken by it: the transport's buffer, and the
    kernel's send queue, which holds megabytes itself and frees room in big steps (so a
    slow reader's progress shows only there)."""
    queued = 0
    sock = transport.get_extra_info("socket")
    if sock is not None and _OUTQ is not None:
        with contextlib.suppress(OSError, ValueError):
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0" * 4))[0]
    return cast(asyncio.WriteTransport, transport).get_write_buffer_size() + queued


def _bad_line(head: bytes) -> str:
    """What is wrong with a head that has a bare CR or LF or a NUL, and on which line."""
    for number, line in enumerate(head.split(b"\r\n"), 1):
        for byte, name in ((b"\n", "a bare LF"), (b"\r", "a bare CR"), (b"\0", "a NUL byte")):
            if byte in line:
                return f"bad request head: line {number} has {name} (header lines end in CRLF)"
    return "bad request head"


_PHRASES = {s.value: s.phrase for s in HTTPStatus}
_SSE_FIELDS = "".join(f"{k}: {v}\r\n" for k, v in SSE_HEADERS.items())
_SSE_FIELDS += "Transfer-Encoding: chunked\r\n"
_dates: tuple[int, str] = (0, "")


def _response_head(status: int, fields: str, close: bool) -> bytes:
    phrase = _PHRASES.get(status, "")
    last = "Connection: close\r\n" if close else ""
    return f"HTTP/1.1 {status} {phrase}\r\nDate: {_date()}\r\n{fields}{last}\r\n".encode()


def _date() -> str:
    """The Date header, formatted once a second."""
    global _dates
    now = int(time.time())
    if _dates[0] != now:
        _dates = (now, formatdate(now, usegmt=True))
    return _dates[1]
