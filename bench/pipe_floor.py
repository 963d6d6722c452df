"""The floor of a Python proxy here: a TCP pipe on uvloop, for bench.dataplanes.

    python bench/pipe_floor.py LISTEN_PORT UPSTREAM_PORT

Each client connection gets its own connection to the upstream, and bytes are passed
both ways as they are read: no HTTP parsed, no routing, no measuring. Nothing a data
plane must do is done, so no L7 proxy written in Python on this event loop can add less
to a request than this does. Not a product path: it only says where the floor is.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

MAX_PENDING = 1 << 20  # bytes held for a peer that is not connected yet


class Half(asyncio.Protocol):
    """One side of a pipe: what it reads is written to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Half | None = None
        self.pending = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        elif len(self.pending) + len(data) <= MAX_PENDING:
            self.pending += data
        elif self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class Client(Half):
    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(Half, "127.0.0.1", self.upstream_port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        up.peer, self.peer = self, up
        if self.pending and up.transport is not None:
            up.transport.write(bytes(self.pending))
            self.pending.clear()


async def main(listen: int, upstream: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(upstream), "127.0.0.1", listen)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
