"""The gateway: one OpenAI-compatible front door for every engine of the fleet.

    engineroom gateway --fleet fleet.toml [--listen HOST:PORT]

Front door: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`. A
request is routed by its model name across that model's deployments, by the live
weights; streams are passed through chunk by chunk as they arrive. docs/architecture.md
(The gateway) is the contract; docs/gateway.md the operator's guide.

One job per module:
- frontdoor: the data path's HTTP server (FrontDoor), which serves the two completion
  routes itself and hands anything else, with its connection, to
- fallback: the aiohttp application (also the whole gateway where it runs alone, as in
  the simulator), with
- admin: the admin API and `/metrics` (the admin token; a viewer token reads);
- relay: one completion forwarded to a deployment (Triton translated, SSE relayed), over
  the pools of kept-alive connections of upstream;
- routetable: models, deployments, live weights, the pick; routes: their SQLite store;
- failover: failover jobs over the route table;
- sink: where an answer goes (Sink), shared by the relay and both servers;
- context: what the front door, the application and the admin API use of the Gateway
  (GatewayContext), so that none of them imports this module.
This module puts them together and runs them (`run_gateway`).

Bounds (docs/security.md): request bodies (`max_body_bytes`) and engines' whole
answers (`max_response_bytes`, else 502) are capped; a stream is read from the engine only
as fast as the client takes it, and a client that takes nothing for `write_timeout_s` is
cut; a request must come within `head_timeout_s`; `max_connections` caps connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from console.core.config.load import ConfigError, Fleet, load_fleet
from console.gateway.context import OpenDoor
from console.gateway.failover.job import Failovers
from console.gateway.http.fallback import build_app
from console.gateway.http.frontdoor import SHUTDOWN_GRACE_S, FrontDoor
from console.gateway.http.relay import Relay
from console.gateway.rollouts.runner import Rollouts
from console.gateway.routing.routes import GatewayStore
from console.gateway.routing.routetable import RouteTable
from console.gateway.routing.upstream import Upstream, health_loop

log = logging.getLogger(__name__)


class Gateway:
    """The parts of one gateway, their start and their end."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        admin_token: str,
        viewer_token: str | None = None,
        api_keys: list[str] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        assert fleet.gateway is not None, "the fleet file has no [gateway] section"
        self.settings = fleet.gateway
        self.admin_token = admin_token.encode()
        # Reads the admin API and /metrics, acts on nothing (console.gateway.http.admin).
        self.viewer_token = viewer_token.encode() if viewer_token else None
        self.api_keys = [k.encode() for k in api_keys or []]
        root = state_dir or Path(self.settings.state_dir).expanduser()
        self.store = GatewayStore(root / "gateway.sqlite")
        self.table = RouteTable(fleet, self.store)
        self.failovers = Failovers(self.table)
        self.rollouts = Rollouts(self.table, self.failovers)
        self.relay = Relay(self.table, self.settings, self.failovers.maybe_auto)
        self.answer = self.relay.answer  # FrontDoor's way in to the data path
        self.http: aiohttp.ClientSession | None = None  # health checks and failovers
        self._tasks: list[asyncio.Task[None]] = []
        self.front_doors: set[OpenDoor] = set()  # FrontDoor's connections, for shutdown
        # Client connections open, FrontDoor's and those handed to aiohttp (run_gateway).
        self.open_connections: Callable[[], int] = lambda: len(self.front_doors)
        self.connections_refused = 0  # over max_connections
        self._cap_logged = -3600.0  # when the connection cap was last logged (monotonic)

    def app(self) -> web.Application:
        """The gateway as an aiohttp application, started and closed with it."""
        return build_app(self)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self.settings.connect_timeout_s,
                sock_read=self.settings.read_timeout_s,
            ),
            auto_decompress=False,
            trust_env=False,
        )
        self.failovers.http = self.http
        self.failovers.settle_interrupted()
        self.rollouts.settle_interrupted()
        self._tasks.append(asyncio.create_task(self.failovers.warm(), name="dataplanes"))
        self._tasks.append(asyncio.create_task(self.rollouts.read_weights(), name="rollouts"))
        self._tasks.append(
            asyncio.create_task(
                health_loop(
                    self.http,
                    self.table.all_upstreams,
                    self.settings.health_interval_s,
                    min(2.0, self.settings.health_interval_s * 2),
                    self._health_changed,
                ),
                name="health",
            )
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.rollouts.close()
        await self.failovers.close()
        for up in self.table.all_upstreams():
            up.pool.close()
        if self.http is not None:
            await self.http.close()
        self.store.close()

    async def drain_front_doors(self, grace: float) -> None:
        """Shutdown: idle connections close now, answers in flight get `grace` seconds."""
        deadline = time.monotonic() + grace
        while True:
            for door in list(self.front_doors):
                if door.task is None and door.transport is not None:
                    door.transport.close()
            if not self.front_doors or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for door in list(self.front_doors):
            if door.transport is not None:
                door.transport.abort()

    def _health_changed(self, upstream: Upstream) -> None:
        if not upstream.up:
            self.failovers.maybe_auto(upstream)

    # -- the front door's checks -------------------------------------------------------

    def client_ok(self, header: str | None) -> bool:
        if not self.api_keys:
            return True
        key = (header or "").removeprefix("Bearer ").strip().encode()
        found = False
        for allowed in self.api_keys:  # every key compared: no early exit on a match
            found |= hmac.compare_digest(key, allowed)
        return found

    def connection_refused(self) -> None:
        """A connection over max_connections: counted; logged at most once a minute."""
        self.connections_refused += 1
        now = time.monotonic()
        if now - self._cap_logged >= 60:
            self._cap_logged = now
            log.warning(
                "max_connections (%d) reached: new connections get 503 until some close "
                "(%d refused so far)", self.settings.max_connections, self.connections_refused,
            )  # fmt: skip


def run_gateway(fleet_path: str, listen: tuple[str, int] | None) -> int:
    """`engineroom gateway`: serve until SIGINT/SIGTERM; SIGHUP reloads fleet.toml."""
    fleet = load_fleet(fleet_path)
    if fleet.gateway is None:
        raise ConfigError(f"{fleet.source}: no [gateway] section (url, token_env, ...)")
    settings = fleet.gateway
    admin = fleet.secret(settings.token_env, ("gateway", "token_env"))
    viewer = os.environ.get(settings.viewer_token_env, "").strip() or None
    if viewer is not None and viewer == admin.strip():
        raise ConfigError(
            f"{fleet.source}: [gateway] viewer_token_env: {settings.viewer_token_env} holds "
            f"the admin token ({settings.token_env}); a viewer token must differ from it"
        )
    keys = None
    if settings.api_keys_env:
        raw = fleet.secret(settings.api_keys_env, ("gateway", "api_keys_env"))
        keys = [k.strip() for k in raw.split(",") if k.strip()]
    host, port = listen or _listen_of(settings.listen or settings.url)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    _raise_open_files(settings.max_connections)
    logging.getLogger("aiohttp.server").addFilter(_malformed_in_one_line)

    async def serve() -> None:
        gateway = Gateway(fleet, admin_token=admin, viewer_token=viewer, api_keys=keys)
        runner = web.AppRunner(
            gateway.app(), access_log=None, handle_signals=False,
            keepalive_timeout=settings.head_timeout_s,  # the next head's deadline, as FrontDoor's
        )  # fmt: skip
        await runner.setup()
        fallback = runner.server
        assert fallback is not None
        gateway.open_connections = lambda: len(gateway.front_doors) + len(fallback.connections)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: FrontDoor(gateway, fallback), host, port, backlog=1024, reuse_address=True
        )
        print(f"engineroom gateway: serving {len(gateway.table.models)} models on "
              f"http://{host}:{port}", flush=True)  # fmt: skip
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)

        def reload() -> None:
            try:
                changes = gateway.table.reload(load_fleet(fleet.source))
                print(f"engineroom gateway: reloaded {fleet.source}: {changes}", flush=True)
            except Exception as exc:  # a bad file keeps the running routes
                print(f"engineroom gateway: reload refused: {exc}", flush=True)

        loop.add_signal_handler(signal.SIGHUP, reload)
        await stop.wait()
        server.close()
        await gateway.drain_front_doors(SHUTDOWN_GRACE_S)
        await runner.cleanup()

    asyncio.run(serve())
    return 0


def _malformed_in_one_line(record: logging.LogRecord) -> bool:
    """aiohttp logs a client's malformed request at ERROR, with a traceback and an excerpt
    of the bad line (which may hold a key): it is the client's doing, so one line, no
    excerpt."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, HttpProcessingError):
        record.msg = "a malformed request from a client, answered %d (%s)"
        record.args = (exc.code, exc.__class__.__name__)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


def _raise_open_files(max_connections: int) -> None:
    """Each client connection can hold a socket to the engine too: ask for the hard limit
    of open files when the soft one is short, and say so when even that is."""
    needed = 2 * max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "max_connections %d needs about %d open files; this process may open %d "
            "(ulimit -n): connections will fail before the cap", max_connections, needed, soft,
        )  # fmt: skip


def _listen_of(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80
