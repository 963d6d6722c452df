"""A host that hangs, and the console answering keys all the same (tests/test_tui.py over
an agent's HTTP, tests/test_ssh.py over SSH)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from console.tui.screens.events import EventsScreen
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.gpus import GpusScreen
from console.tui.screens.models import ModelsScreen
from tests.tui_support import until


@dataclass
class HungHost:
    """TEST DOUBLE of a host that hangs: loopback `port` accepts connections and never
    answers; `accepted` holds each one, so a test can wait until a read has reached it."""

    port: int
    accepted: list[asyncio.StreamWriter] = field(default_factory=list)


@contextlib.asynccontextmanager
async def hung_host() -> AsyncIterator[HungHost]:
    host = HungHost(0)

    def hang(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> Any:
        host.accepted.append(w)
        return asyncio.sleep(3600)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    host.port = server.sockets[0].getsockname()[1]
    try:
        yield host
    finally:
        server.close()


async def switch_screens(pilot: Any, app: Any) -> None:
    """m, g, v and n: each key's screen is shown (within 10 s each)."""
    for key, screen in (
        ("m", ModelsScreen),
        ("g", GpusScreen),
        ("v", EventsScreen),
        ("n", FleetScreen),
    ):
        await pilot.press(key)
        await until(pilot, lambda s=screen: isinstance(app.screen, s), 10, f"{key} answered")
