"""The data path behind the front door: one completion request, forwarded to a deployment.

A request is routed by its model name (console.gateway.routing.routetable) and its body forwarded
as the bytes that came in (parsed once, for the model and `stream`; rewritten only when
the engine's model name differs). Each upstream chunk is written out as soon as it is
read, never parsed. Triton deployments get OpenAI <-> generate/generate_stream
translation (console.gateway.http.triton_openai), their SSE events reshaped into OpenAI's.

A request that failed before any byte reached the client (refused connection, 5xx) is
retried once on another routable deployment. A stream that already sent bytes is never
replayed: if its engine dies, the client gets an error event and the stream ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from console.core.config.load import GatewaySection
from console.gateway.http import triton_openai as tri
from console.gateway.http.sink import ClientGone, ClientStalled, Sink, send_error
from console.gateway.routing.routetable import RouteTable
from console.gateway.routing.upstream import Answer, AnswerTooLarge, Upstream, UpstreamError

log = logging.getLogger(__name__)


class NotStarted(Exception):
    """The upstream failed before the client got a byte: safe to try another deployment."""


class BadAnswer(Exception):
    """The engine's answer is not passed on (over a cap): a 502, not retried elsewhere."""


class Relay:
    """Answers completions from the route table's deployments. `went_down` is told of a
    deployment a request found down (for automatic failover)."""

    def __init__(
        self,
        table: RouteTable,
        settings: GatewaySection,
        went_down: Callable[[Upstream], None],
    ) -> None:
        self.table = table
        self.settings = settings
        self.went_down = went_down
        self.clients_gone = 0  # hung up before their answer was complete
        self.clients_stalled = 0  # read nothing for write_timeout_s, and were cut

    async def answer(self, body: bytes, chat: bool, sink: Sink) -> None:
        """One completion (chat or not) from an authorized client, answered into `sink`. A
        client that leaves before the end is counted and logged, not failed on."""
        try:
            await self._answer(body, chat, sink)
        except ClientGone as gone:
            self.client_left(gone, sink)

    def client_left(self, gone: ClientGone, sink: Sink) -> None:
        up = sink.upstream
        where = "the gateway" if up is None else f"{up.model}/{up.id}"
        if isinstance(gone, ClientStalled):
            self.clients_stalled += 1
            log.warning(
                "a client stopped reading for %g s (write_timeout_s): its answer from %s "
                "was cut", self.settings.write_timeout_s, where,
            )  # fmt: skip
        else:
            self.clients_gone += 1
            log.warning("a client went away before its answer from %s was complete", where)

    async def _answer(self, body: bytes, chat: bool, sink: Sink) -> None:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            return await send_error(
                sink, 400, f"the body is not JSON: {exc}", "invalid_request_error"
            )
        if not isinstance(data, dict):
            return await send_error(
                sink, 400, "the body must be a JSON object", "invalid_request_error"
            )
        model = data.get("model")
        if not isinstance(model, str) or model not in self.table.models:
            return await send_error(
                sink,
                404,
                f"the model {model!r} does not exist (models: {', '.join(self.table.models)})",
                "invalid_request_error",
                "model_not_found",
            )
        stream = data.get("stream") is True
        tried: list[str] = []
        why = "no healthy deployment has weight"
        for _ in range(2):  # the first choice, then one retry elsewhere
            upstream = self.table.pick(model, tried)
            if upstream is None:
                break
            tried.append(upstream.id)
            sink.upstream = upstream
            try:
                return await self._forward(sink, upstream, data, body, chat, stream)
            except NotStarted as exc:
                why = f"{upstream.id}: {exc}"
            except BadAnswer as exc:
                return await send_error(sink, 502, f"{upstream.id}: {exc}", "server_error")
            except tri.BadRequest as exc:
                return await send_error(sink, 400, str(exc), "invalid_request_error")
        await send_error(
            sink, 503, f"no deployment of {model} could answer ({why})", "server_error"
        )

    async def _forward(
        self,
        sink: Sink,
        up: Upstream,
        data: dict[str, Any],
        body: bytes,
        chat: bool,
        stream: bool,
    ) -> None:
        up.inflight += 1
        try:
            if up.kind == "triton":
                return await self._triton(sink, up, data, chat, stream)
            if data["model"] != up.engine_model:
                body = json.dumps({**data, "model": up.engine_model}).encode()
            path = "/v1/chat/completions" if chat else "/v1/completions"
            return await self._pass_through(sink, up, path, body, stream)
        finally:
            up.inflight -= 1

    async def _open(
        self,
        up: Upstream,
        path: str,
        body: bytes,
        relay_to: Callable[[bytes, bool], bool] | None = None,
    ) -> Answer:
        """POST upstream; any failure here is before the client saw a byte."""
        settings = self.settings
        try:
            return await up.pool.post(
                path, body, settings.connect_timeout_s, settings.read_timeout_s, relay_to
            )
        except AnswerTooLarge as exc:
            up.measures.outcomes.add(False)
            raise BadAnswer(str(exc)) from None
        except UpstreamError as exc:  # refused, reset or closed before an answer
            up.measures.outcomes.add(False)
            if up.mark_down(f"connection failed: {exc}"):
                self.went_down(up)
            raise NotStarted("connection failed") from None
        except TimeoutError:
            up.measures.outcomes.add(False)
            raise NotStarted("no answer within read_timeout_s") from None

    async def _read(self, up: Upstream, ans: Answer) -> bytes:
        """A whole answer; a failure while reading it is still before the client's first
        byte, so another deployment may answer."""
        try:
            payload = await ans.read(self.settings.max_response_bytes)
        except AnswerTooLarge as exc:
            up.measures.outcomes.add(False)
            raise BadAnswer(f"{exc} (max_response_bytes)") from None
        except (UpstreamError, TimeoutError) as exc:
            up.measures.outcomes.add(False)
            raise NotStarted(f"the answer was cut: {exc}") from None
        if ans.status >= 500:
            up.measures.outcomes.add(False)
            if up.server_error(ans.status):
                self.went_down(up)
            text = payload[:200].decode(errors="replace")
            raise NotStarted(f"HTTP {ans.status}: {text}")
        return payload

    async def _pass_through(
        self, sink: Sink, up: Upstream, path: str, body: bytes, stream: bool
    ) -> None:
        started = time.perf_counter()
        timed = Timed(sink, up, started)
        # A stream's first chunks may reach the client before this task hears of the head.
        ans = await self._open(up, path, body, timed.write_now if stream else None)
        try:
            if not stream or ans.status != 200:
                payload = await self._read(up, ans)
                up.measures.e2e.add(time.perf_counter() - started)
                up.measures.outcomes.add(True)
                content_type = ans.content_type or "application/json"
                return await sink.reply(ans.status, payload, content_type, up.id)
            await sink.open_stream(up.id)
            await self._relay(timed, ans.chunks(), None)
        finally:
            ans.relay_to = None
            up.pool.release(ans)

    async def _relay(
        self, timed: Timed, chunks: AsyncIterator[bytes], shaper: tri.Shaper | None
    ) -> bool | None:
        """Copy upstream chunks to the client as they come; measure TTFT and gaps.

        Chunks are passed as read, never parsed (an SSE chunk is usually one token); while
        the client's socket has room, the upstream's protocol writes them itself
        (`Timed.write_now`), and `chunks` yields only what had to wait.
        Returns True when the upstream finished, False when it was cut (the client got an
        error event); ClientGone when the client went away (not the deployment's failure)."""
        sink, up = timed.sink, timed.up
        try:
            async for chunk in chunks:
                if shaper is not None:
                    chunk = _triton_chunk(shaper, chunk)
                    if not chunk:
                        continue
                timed.mark()
                await sink.write(chunk)
            if shaper is not None:
                await sink.write(shaper.last())
        except (UpstreamError, TimeoutError, tri.BadRequest) as exc:
            up.measures.outcomes.add(False)
            why = str(exc) or exc.__class__.__name__
            event = {
                "error": {
                    "message": f"the engine ({up.id}) stopped mid-answer: {why}",
                    "type": "server_error",
                }
            }
            with contextlib.suppress(ClientGone):  # and the stream ends, for the client
                await sink.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                await sink.close_stream()
            return False
        up.measures.e2e.add(time.perf_counter() - timed.started)
        up.measures.outcomes.add(True)
        with contextlib.suppress(ClientGone):
            await sink.close_stream()
        return True

    async def _triton(
        self, sink: Sink, up: Upstream, data: dict[str, Any], chat: bool, stream: bool
    ) -> None:
        path, tbody = tri.request(data, chat, up.dep, up.engine_model)
        shaper = tri.Shaper(chat, up.model, tbody["max_tokens"])
        started = time.perf_counter()
        ans = await self._open(up, path, json.dumps(tbody).encode())
        try:
            if ans.status != 200:
                text = (await self._read(up, ans)).decode(errors="replace")
                up.measures.outcomes.add(True)  # a client error, not the deployment's
                message = text
                with contextlib.suppress(ValueError, AttributeError):
                    message = str(json.loads(text).get("error", text))
                return await send_error(sink, ans.status, message[:500], "invalid_request_error")
            if not stream:
                text = tri.text_of(await self._read(up, ans))
                up.measures.e2e.add(time.perf_counter() - started)
                up.measures.outcomes.add(True)
                payload = json.dumps(shaper.response(text)).encode()
                return await sink.reply(200, payload, "application/json", up.id)
            await sink.open_stream(up.id)
            events = sse_events(ans.chunks(), self.settings.max_response_bytes)
            await self._relay(Timed(sink, up, started), events, shaper)
        finally:
            up.pool.release(ans)


class Timed:
    """One stream to a client, timed as it is written: TTFT at its first chunk (since
    `started`, when the request was sent on), the gap since the last chunk after that."""

    __slots__ = ("first", "last", "sink", "started", "up")

    def __init__(self, sink: Sink, up: Upstream, started: float) -> None:
        self.sink = sink
        self.up = up
        self.started = self.last = started
        self.first = True

    def mark(self) -> None:
        now = time.perf_counter()
        if self.first:
            self.up.measures.ttft.add(now - self.started)
            self.first = False
        else:
            self.up.measures.itl.add(now - self.last)
        self.last = now

    def write_now(self, chunk: bytes, last: bool) -> bool:
        """The upstream's protocol, with a chunk just read (and whether the answer is
        complete): written, and timed, when the client's socket has room; False when the
        relay's task must write it."""
        if not chunk and not last:
            return True
        if not self.sink.open_now(self.up.id) or not self.sink.write_now(chunk, last):
            return False
        if chunk:
            self.mark()
        return True


async def sse_events(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The `data:` payloads of an SSE stream, one per event; UpstreamError on a line over
    `limit` bytes (an engine that never ends one)."""
    rest = b""
    async for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        if len(rest) > limit:
            raise UpstreamError(f"an SSE line over {limit} bytes (max_response_bytes)")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()
    rest = rest.strip()
    if rest.startswith(b"data:"):
        yield rest[5:].strip()


def _triton_chunk(shaper: tri.Shaper, event: bytes) -> bytes:
    text = tri.text_of(event)
    return shaper.chunk(text) if text else b""
