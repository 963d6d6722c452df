"""Where one answer goes: the Sink the relay writes to (FrontDoor's connection or an aiohttp
response), the client's departures (ClientGone, ClientStalled) and the OpenAI error body.

The relay, the front door and the aiohttp application (fallback) all write answers; this
module sits below the three, so none of them imports another for these.
"""

from __future__ import annotations

import json

from console.gateway.routing.upstream import Upstream

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SERVED_BY = "X-Engineroom-Deployment"  # which deployment answered: for clients and benches


class ClientGone(Exception):
    """The client closed its connection: not the deployment's failure."""


class ClientStalled(ClientGone):
    """The client read nothing for `write_timeout_s`: the gateway cut its connection."""


def error_body(message: str, kind: str, code: str | None = None) -> bytes:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json.dumps(body).encode()


class Sink:
    """Where one answer goes: an aiohttp response, or FrontDoor's connection."""

    upstream: Upstream | None = None  # the deployment answering, once picked (for logs)

    async def reply(
        self, status: int, body: bytes, content_type: str, served_by: str | None
    ) -> None:
        """A whole answer."""
        raise NotImplementedError

    async def open_stream(self, served_by: str) -> None:
        """A 200 SSE answer begins (its head may wait for the first chunk)."""
        raise NotImplementedError

    async def write(self, chunk: bytes) -> None:
        """One chunk of the stream, sent now; ClientGone when the client left."""
        raise NotImplementedError

    async def close_stream(self) -> None:
        raise NotImplementedError

    def open_now(self, served_by: str) -> bool:
        """`open_stream` with no wait, once (a second call does nothing); False when this
        sink cannot."""
        return False

    def write_now(self, chunk: bytes, last: bool) -> bool:
        """One chunk of the stream (and its end, when `last`), sent now if the client's
        socket has room, with no wait; False when it must go through `write` (a full or
        closed socket, a sink that cannot)."""
        return False


async def send_error(
    sink: Sink, status: int, message: str, kind: str, code: str | None = None
) -> None:
    await sink.reply(status, error_body(message, kind, code), "application/json", None)
