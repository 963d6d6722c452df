"""The gateway's view of one deployment: where it is, whether it is routable, how many
requests it has in flight, and what clients saw from it.

Health, two ways:
- active: every `health_interval_s` the engine's own health endpoint (vLLM and
  trtllm-serve `GET /health`; Triton `GET /v2/health/ready` and the model's ready);
- passive: a refused or reset connection marks it down at once; three 5xx answers within
  ten seconds too. An active check that passes brings it back.

Bounds: the engine's answer is read only as fast as the client takes it (reading pauses
past PAUSE_AT bytes held), a whole answer stops at the caller's cap (AnswerTooLarge), a
head at MAX_HEAD_BYTES; a health check reads no body it does not need.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import aiohttp
import httptools

from console.core.config.load import Deployment, Model
from console.gateway.routing.measure import Measures

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
    checks: int = 0  # active checks done, for /metrics
    _errors: deque[float] = field(default_factory=deque)
    _pool: Pool | None = None

    @property
    def pool(self) -> Pool:
        """Kept-alive connections to the endpoint (made again when a reload moves it)."""
        pool = self._pool
        if pool is None or pool.endpoint != self.dep.endpoint:
            if pool is not None:
                pool.close()
            pool = self._pool = Pool(self.dep.endpoint)
        return pool

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


HEALTH_BODY_MAX = 65536  # a longer health answer is left unread (its connection closes)


async def check(http: aiohttp.ClientSession, upstream: Upstream, timeout: float) -> str | None:
    """None when healthy, else why not. Only the status counts: a short body is read so
    that the connection is kept for the next check, a long or endless one never is."""
    for url in upstream.health_urls():
        try:
            async with asyncio.timeout(timeout), http.get(url) as resp:
                length = resp.content_length
                if length is not None and length <= HEALTH_BODY_MAX:
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
            upstream.checks += 1
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


# -- the data path's HTTP/1.1 client -----------------------------------------------------
#
# Requests to engines go through this small client rather than aiohttp's: one write per
# request, the answer parsed by httptools (C) as it arrives, kept-alive connections per
# deployment. aiohttp's client costs ~0.2 ms of Python per request, which a 0.3 ms
# budget for the whole gateway cannot carry (docs/gateway.md, Figures).

MAX_IDLE = 64  # kept-alive connections per deployment
MAX_HEAD_BYTES = 65536  # an answer's status line and headers
# Body bytes held per answer before reading from the engine pauses: the engine is read
# only as fast as the client takes what was read (backpressure, end to end).
PAUSE_AT = 256 * 1024


class UpstreamError(Exception):
    """The engine's connection failed or closed before its answer was complete."""


class NotConnected(UpstreamError):
    """No connection could be made (refused, unreachable, connect timeout)."""


class AnswerTooLarge(UpstreamError):
    """The engine's answer, or its head, is over the gateway's cap: not passed on."""


class Answer(asyncio.Protocol):
    """One kept-alive connection to an engine, and the answer being read on it."""

    def __init__(self, read_timeout: float) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.read_timeout = read_timeout
        self.busy = False  # a request was sent and its answer not finished
        self._sent = 0.0  # when the request was sent (monotonic)
        self._paused = False  # reading from the engine, paused for a slow client
        # read_timeout_s: one timer per connection, moved on only when it fires (made and
        # cancelled per answer, it costs more than the rest of the answer's handling).
        self._timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = ""
        self.keep_alive = True
        self.started = False  # any byte of the answer came
        self.headers_done = False
        self.done = False  # the answer is complete
        self.error: BaseException | None = None
        self._body: list[bytes] = []
        self._held = 0  # bytes in _body
        self._head_bytes = 0  # bytes read before the headers were complete
        self._waiter: asyncio.Future[None] | None = None
        self._last = 0.0
        self._streaming = False  # read by chunks(): the deadline is per gap, past the head
        self._framed = False  # Content-Length or chunked: else the body ends at close
        # Set by the relay for a stream: a 200 answer's body read by one data_received
        # goes to the client from here, with no wake-up of the relay's task, and with the
        # stream's end when the answer is complete (one write); it returns False when the
        # client's socket is full (the task then takes it, and waits for the client).
        self.relay_to: Callable[[bytes, bool], bool] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # nothing was asked: a kept-alive connection is not reusable
            assert self.transport is not None
            self.transport.close()
            return
        self.started = True
        self._last = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad HTTP from the engine: {exc}"))
            if self.transport is not None:
                self.transport.close()
            return
        if not self.headers_done:  # the parser holds a head's partial lines itself
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(AnswerTooLarge(f"a head over {MAX_HEAD_BYTES} bytes"))
                if self.transport is not None:
                    self.transport.close()
        elif self._relaying() and (self._body or self.done):
            assert self.relay_to is not None
            if self.relay_to(self._joined() if self._body else b"", self.done):
                self._clear()
                if self.done:
                    self.relay_to = None
            else:
                self._wake()  # the relay's task takes it, and waits for the client

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.headers_done and not self._framed and not self.done:
            self.on_message_complete()  # a body delimited by the close
        elif not self.done:
            self._fail(UpstreamError("the engine closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value.decode("latin-1")
        elif lower in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._held += len(body)
        if self._held > PAUSE_AT and not self._paused and self.transport is not None:
            self.transport.pause_reading()  # resumed when the relay takes the bytes
            self._paused = True
        if not self._relaying():  # else data_received passes it on, or wakes the task
            self._wake()

    def _relaying(self) -> bool:
        return self.relay_to is not None and self.status == 200

    def on_message_complete(self) -> None:
        self.done = True
        self._wake()

    # the request side
    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.busy = True
        self._sent = self._last = time.monotonic()
        self.transport.write(head + body)
        if self._paused:  # a kept-alive connection that ended its last answer paused
            self._paused = False
            self.transport.resume_reading()

    async def headers(self) -> None:
        while not self.headers_done:
            await self._wait()

    async def read(self, limit: int) -> bytes:
        """The whole body; AnswerTooLarge past `limit` bytes (the connection is then
        closed by `finish`, which stops the engine)."""
        parts: list[bytes] = []
        size = 0
        while True:
            if self._body:
                size += self._held
                if size > limit:
                    raise AnswerTooLarge(f"an answer over {limit} bytes")
                parts.append(self._take())
            elif self.done:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            else:
                await self._wait()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: what has come since the last chunk, joined."""
        self._streaming = True
        while True:
            if self._body:
                yield self._take()
            elif self.done:
                return
            else:
                await self._wait()

    def _take(self) -> bytes:
        chunk = self._joined()
        self._clear()
        return chunk

    def _joined(self) -> bytes:
        body = self._body
        if len(body) > 1:
            body[:] = [b"".join(body)]
        return body[0]

    def _clear(self) -> None:
        self._body = []
        self._held = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        if self._timer is None:
            self._timer = loop.call_at(loop.time() + self.read_timeout, self._check_timeout)
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def _check_timeout(self) -> None:
        """read_timeout_s bounds the gap between two reads of a stream; a head, and a whole
        answer, must be complete within it of the request (an engine could trickle)."""
        if not self.busy:  # between answers: the next one's first wait sets it again
            self._timer = None
            return
        if self._paused:  # waiting on the client, not on the engine
            self._last = time.monotonic()
        per_gap = self._streaming and self.headers_done
        idle = time.monotonic() - (self._last if per_gap else self._sent)
        if idle < self.read_timeout:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + self.read_timeout - idle, self._check_timeout)
            return
        self._timer = None
        if not self.done:
            what = "no data from the engine for" if per_gap else "no whole answer within"
            self._fail(TimeoutError(f"{what} {self.read_timeout:g} s (read_timeout_s)"))
            if self.transport is not None:
                self.transport.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def finish(self) -> bool:
        """After the answer: True when the connection can serve another request."""
        self.busy = False
        reusable = self.done and self.keep_alive and self.transport is not None
        if not reusable and self.transport is not None:
            self.transport.close()  # an answer left unread: closing aborts it at the engine
        return reusable


class Pool:
    """Kept-alive connections to one engine endpoint."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        parts = urlsplit(endpoint)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.path_prefix = parts.path.rstrip("/")
        self.authority = parts.netloc.encode()
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.idle: list[Answer] = []

    async def post(
        self,
        path: str,
        body: bytes,
        connect_timeout: float,
        read_timeout: float,
        relay_to: Callable[[bytes, bool], bool] | None = None,
    ) -> Answer:
        """Send a JSON POST and wait for the answer's status and headers; `relay_to` is
        the answer's `relay_to` (a stream's body, passed on as it is read).

        A kept-alive connection that the engine closed meanwhile is retried once on a new
        one; NotConnected and UpstreamError mean the engine got nothing it answered."""
        head = (
            b"POST " + (self.path_prefix + path).encode() + b" HTTP/1.1\r\nHost: "
            + self.authority + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n"
        )  # fmt: skip
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is None or conn.transport.is_closing():
                continue
            conn.read_timeout = read_timeout
            conn.send(head, body)
            conn.relay_to = relay_to
            try:
                await conn.headers()
                return conn
            except UpstreamError:
                conn.finish()
                if conn.started:
                    raise
                break  # a stale connection: the engine closed it while idle
            except BaseException:  # a timeout, or the client left: the engine stops too
                conn.finish()
                raise
        conn = await self._connect(connect_timeout, read_timeout)
        conn.send(head, body)
        conn.relay_to = relay_to
        try:
            await conn.headers()
        except BaseException:
            conn.finish()
            raise
        return conn

    async def _connect(self, connect_timeout: float, read_timeout: float) -> Answer:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Answer(read_timeout), self.host, self.port, ssl=self.tls
                )
        except TimeoutError:
            raise NotConnected(f"no connection within {connect_timeout:g} s") from None
        except OSError as exc:
            raise NotConnected(exc.strerror or exc.__class__.__name__) from None
        return conn

    def release(self, conn: Answer) -> None:
        if conn.finish() and len(self.idle) < MAX_IDLE:
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()
