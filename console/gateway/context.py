"""What the gateway's parts use of the gateway that holds them: the front door
(console.gateway.http.frontdoor), the aiohttp application (fallback) and the admin API (admin)
read it through GatewayContext, so none of them imports the server, which puts them
together (console.gateway.server.Gateway is the one GatewayContext).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from console.core.config.load import GatewaySection
from console.gateway.failover.job import Failovers
from console.gateway.http.relay import Relay
from console.gateway.http.sink import Sink
from console.gateway.rollouts.runner import Rollouts
from console.gateway.routing.routetable import RouteTable


class OpenDoor(Protocol):
    """A client connection the front door serves, as the gateway's shutdown sees it."""

    task: asyncio.Task[None] | None  # the answer in flight, if any
    transport: asyncio.Transport | None  # None once the connection is lost


class GatewayContext(Protocol):
    """One gateway's settings, tokens, parts and connection counts."""

    settings: GatewaySection
    admin_token: bytes
    viewer_token: bytes | None  # reads the admin API and /metrics, acts on nothing
    table: RouteTable
    failovers: Failovers
    rollouts: Rollouts
    relay: Relay
    front_doors: set[OpenDoor]  # FrontDoor's connections, for shutdown
    open_connections: Callable[[], int]  # client connections open, all servers'
    connections_refused: int  # over max_connections

    async def answer(self, body: bytes, chat: bool, sink: Sink) -> None:
        """The data path's way in: one completion, answered through `sink`."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def client_ok(self, header: str | None) -> bool:
        """The client's Authorization header holds an API key (or none is asked for)."""
        ...

    def connection_refused(self) -> None:
        """Count (and log) a connection refused over max_connections."""
        ...
