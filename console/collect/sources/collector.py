"""The fleet collector: polls every node's agent and keeps the last good state with its age.

Each node has its own poll loop. A poll reschedules itself only after the previous one
finished, so a slow node never piles up requests; failures back off exponentially per
node. A node is "stale" once its last good snapshot is older than 2 refreshes and
"down" past 5, and the screen says so. The TUI and `engineroom check` share this code.

Transport: the snapshot streams are read straight off their sockets (linestream.py) and
decoded into msgspec structs (console/core/snapshot.py) by one task, a few milliseconds at
a time; polls and other requests share one aiohttp session for the whole fleet (about a
fortieth of the CPU of one shared httpx client per poll round at 1,000 nodes, as measured
on a 2-core machine: 140 ms against 5,880 ms). bench/console_scale.py measures the whole
console at 10 to 1,000 nodes.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from console.collect.sources.linestream import LineStream, StreamError, StreamStatus, open_stream
from console.collect.sources.source import (  # noqa: F401  (NodeStatus, the thresholds: re-exported)
    DOWN_AFTER,
    STALE_AFTER,
    ModelHistory,
    NodeState,
    NodeStatus,
    SourceHealth,
)
from console.collect.sources.ssh import SshError, SshReader
from console.collect.views.history import History
from console.core.config.load import Fleet, MissingSecret, Node
from console.core.fetch import capped_body
from console.core.oslimits import raise_open_files
from console.core.snapshot import Snapshot, SnapshotError, decode_snapshot
from console.core.units import size_from_bytes

MAX_BACKOFF_S = 30.0
STREAM_WATCH_S = 0.5  # how often the watchdog looks for streams gone quiet
DECODE_SLICE_S = 0.005  # the longest the decoder holds the event loop at a time
MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024
MAX_WHOAMI_BYTES = 64 * 1024  # {"name", "role", "jobs"}: tens of bytes


class PollError(Exception):
    """Why a poll failed, worded for the node row: "timed out after 2 s", "HTTP 401"."""


@dataclass
class _Target:
    node: Node
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    stream: bool = True  # False once the agent answers 404 to the stream (an older agent)
    # While a stream is read: the stream, and the loop time by which the next snapshot is
    # due (the collector's one watchdog closes a stream that misses it).
    reading: LineStream | None = None
    due: float = 0.0
    quiet: float = 0.0  # how long the stream may go without a line


class Collector:
    """Polls the fleet in the background; `states` always holds the latest view. A
    FleetSource (console/collect/sources/source.py)."""

    refreshes = False  # a source that reads in refreshes says so (on_refreshed)
    health: SourceHealth | None = None  # the agents' health is their nodes' states

    def __init__(
        self,
        fleet: Fleet,
        *,
        refresh_s: float | None = None,
        timeout_s: float | None = None,
        on_update: Callable[[NodeState], None] | None = None,
        mode: Literal["stream", "poll"] | None = None,
    ) -> None:
        self.fleet = fleet
        self.mode = mode or fleet.fleet.collect
        self.refresh_s = refresh_s or fleet.fleet.refresh_s
        self.timeout_s = timeout_s or max(1.0, min(5.0, 2 * self.refresh_s))
        self.on_update = on_update
        # Called once a refresh's readings are all in the node states (a source that reads
        # the fleet in refreshes, as Prometheus): the console draws them then.
        self.on_refreshed: Callable[[], None] | None = None
        self.states = {n.name: NodeState(n.name, n.transport) for n in fleet.nodes}
        self.history = History()
        self._targets = [
            t for i, n in enumerate(fleet.nodes) if n.agent and (t := self._target(i, n))
        ]
        self._sessions = asyncio.Semaphore(fleet.fleet.ssh_concurrency)
        self._ssh = [
            SshReader(fleet, n, self._sessions) for n in fleet.nodes if not n.agent and n.ssh
        ]
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Stream lines not decoded yet, the newest per node (see _decode_arrivals).
        self._arrived: dict[str, tuple[_Target, bytes]] = {}
        self._arrival = asyncio.Event()

    def _target(self, index: int, node: Node) -> _Target | None:
        """How to poll the node; None when its token variable is not set (one node without
        a token costs that node, not the fleet)."""
        headers = {}
        if node.token_env:
            try:
                token = self.fleet.secret(node.token_env, ("nodes", index, "token_env"))
            except MissingSecret as exc:
                state = self.states[node.name]
                state.no_token, state.error = exc.env_name, exc.short
                return None
            headers["Authorization"] = f"Bearer {token}"
        return _Target(
            node,
            f"{(node.agent or '').rstrip('/')}/v1/snapshot",
            headers,
            stream=self.mode == "stream",
        )

    def history_source(self) -> ModelHistory | None:
        return None  # the agents keep no history from before the console started

    async def __aenter__(self) -> Collector:
        raise_open_files(len(self._targets) + 256)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            trust_env=False,
            read_bufsize=2**20,  # a stream line is one snapshot
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        await asyncio.gather(*(reader.close() for reader in self._ssh), return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def start(self) -> None:
        """Start one self-rescheduling poll loop per node, spread over the first refresh."""
        for target in self._targets:
            self._tasks.append(asyncio.create_task(self._loop(target), name=target.node.name))
        if any(t.stream for t in self._targets):
            self._tasks.append(asyncio.create_task(self._watch_streams(), name="stream watchdog"))
            self._tasks.append(asyncio.create_task(self._decode_arrivals(), name="decoder"))
        for reader in self._ssh:
            self._tasks.append(asyncio.create_task(self._ssh_loop(reader), name=reader.node.name))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def poll_all(self) -> dict[str, NodeState]:
        """Poll every node once, concurrently (for `engineroom check`)."""
        await asyncio.gather(
            *(self._poll(t) for t in self._targets), *(self._ssh_poll(r) for r in self._ssh)
        )
        return self.states

    async def _ssh_loop(self, reader: SshReader) -> None:
        """Like `_loop`, at the SSH refresh: a run of `engineroom agent --once` costs a
        process start on the host, so it is not done every second."""
        every = max(self.refresh_s, self.fleet.fleet.ssh_refresh_s)
        await asyncio.sleep(random.uniform(0, every))
        while True:
            started = time.monotonic()
            await self._ssh_poll(reader)
            state = self.states[reader.node.name]
            if state.failures:
                delay = min(every * 2 ** min(state.failures - 1, 4), MAX_BACKOFF_S)
                delay *= random.uniform(0.8, 1.2)
            else:
                delay = every - (time.monotonic() - started)
            await asyncio.sleep(max(0.0, delay))

    async def _ssh_poll(self, reader: SshReader) -> None:
        started = time.monotonic()
        self.states[reader.node.name].last_attempt = started
        try:
            snapshot = await reader.snapshot()
        except SshError as exc:
            state = self._failed(reader, str(exc))
        else:
            state = self._record(reader, snapshot)
        state.poll_ms = (time.monotonic() - started) * 1000
        if self.on_update is not None:
            self.on_update(state)

    async def _loop(self, target: _Target) -> None:
        await asyncio.sleep(random.uniform(0, self.refresh_s))  # no thundering herd
        while True:
            started = time.monotonic()
            if target.stream:
                await self._follow(target)
            else:
                await self._poll(target)
            state = self.states[target.node.name]
            if state.failures:
                delay = min(self.refresh_s * 2 ** min(state.failures - 1, 8), MAX_BACKOFF_S)
                delay *= random.uniform(0.8, 1.2)
            else:
                delay = self.refresh_s - (time.monotonic() - started)
            await asyncio.sleep(max(0.0, delay))

    def _record(self, target: _Target | SshReader, snapshot: Snapshot) -> NodeState:
        state = self.states[target.node.name]
        state.snapshot = snapshot
        state.last_ok = time.monotonic()
        state.failures = 0
        state.error = None
        state.polls += 1
        self.history.record(target.node.name, snapshot)
        return state

    def _failed(self, target: _Target | SshReader, error: str) -> NodeState:
        state = self.states[target.node.name]
        state.failures += 1
        state.error = error
        return state

    async def _watch_streams(self) -> None:
        """Close every stream whose next snapshot is overdue: it then fails with "no
        snapshot within". One task for the fleet instead of a deadline per stream moved
        on by each snapshot (at 1,000 nodes, 1,000 timer handles made and dropped a
        second, about 5 % of the console's CPU)."""
        clock = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(STREAM_WATCH_S)
            now = clock.time()
            for target in self._targets:
                if target.reading is not None and now > target.due:
                    target.reading.close(TimeoutError())

    async def _decode_arrivals(self) -> None:
        """Decode the lines the streams brought, a few milliseconds at a time.

        A line is only set aside when it arrives (linestream hands it over in the socket's
        callback); decoding, recording and deriving the view happen here, in slices of
        DECODE_SLICE_S with the event loop let go in between. A key press then waits
        for one slice, not for every socket that was ready, and a node whose lines come
        faster than they are decoded costs one decode, of its newest line.
        """
        clock = asyncio.get_running_loop()
        arrived = self._arrived
        while True:
            await self._arrival.wait()
            self._arrival.clear()
            while arrived:
                until = clock.time() + DECODE_SLICE_S
                while arrived and clock.time() < until:
                    target, line = arrived.pop(next(iter(arrived)))
                    self._take(target, line)
                await asyncio.sleep(0)

    def _take(self, target: _Target, line: bytes) -> None:
        try:
            snapshot = _parse(line)
        except PollError as exc:
            if target.reading is not None:
                target.reading.close(exc)  # its _follow says why, and reconnects
            return
        state = self._record(target, snapshot)
        # For a stream, the delay from the agent taking it to us having it.
        state.poll_ms = max(0.0, (time.time() - snapshot.node.time) * 1000)
        # An agent that cycles slower than we refresh sends lines less often.
        target.quiet = max(target.quiet, 2.5 * (snapshot.cycle.get("interval_s") or 0.0))
        if self.on_update is not None:
            self.on_update(state)

    async def _follow(self, target: _Target) -> None:
        """Read the agent's snapshot stream until it fails; the caller reconnects.

        One connection per node and one line per snapshot: no request per refresh. Lines
        are set aside as they arrive (console/collect/sources/linestream.py) and decoded by
        `_decode_arrivals`. A stream that goes quiet for longer than the timeout counts
        as a failure (within STREAM_WATCH_S more: the watchdog looks that often).
        """
        name = target.node.name
        target.quiet = max(self.timeout_s, 3 * self.refresh_s)
        state = self.states[name]
        state.last_attempt = time.monotonic()
        clock = asyncio.get_running_loop()
        arrived, arrival = self._arrived, self._arrival

        def took(line: bytes) -> None:
            target.due = clock.time() + target.quiet
            arrived[name] = (target, line)
            arrival.set()

        try:
            try:
                stream = await open_stream(
                    target.url + "/stream",
                    target.headers,
                    took,
                    max_line=MAX_SNAPSHOT_BYTES,
                    timeout_s=self.timeout_s,
                )
            except TimeoutError:
                raise PollError(f"no answer within {self.timeout_s:g} s") from None
            except StreamStatus as exc:
                if exc.status == 404:
                    target.stream = False  # an agent without the stream: poll it instead
                    return
                self._check_status(exc.status)
                raise
            target.due, target.reading = clock.time() + target.quiet, stream
            try:
                await stream.ended
            finally:
                target.reading = None
                stream.close(StreamError("closed"))
                if (last := arrived.pop(name, None)) is not None:
                    self._take(*last)  # what came before the end, before the failure
        except PollError as exc:
            state = self._failed(target, str(exc))
        except TimeoutError:
            state = self._failed(target, f"no snapshot within {target.quiet:g} s")
        except ConnectionRefusedError:
            state = self._failed(target, "connection refused")
        except StreamError as exc:
            state = self._failed(target, str(exc))
        except (OSError, ValueError) as exc:
            state = self._failed(target, f"{exc.__class__.__name__}: {exc}"[:200])
        if self.on_update is not None:
            self.on_update(state)

    @staticmethod
    def _check_status(status: int) -> None:
        if status in (401, 403):
            raise PollError(f"HTTP {status}: the agent refused the token")
        if status != 200:
            raise PollError(f"HTTP {status} from the agent")

    async def _poll(self, target: _Target) -> None:
        started = time.monotonic()
        self.states[target.node.name].last_attempt = started
        try:
            snapshot = await self._fetch(target)
        except PollError as exc:
            state = self._failed(target, str(exc))
        else:
            state = self._record(target, snapshot)
        state.poll_ms = (time.monotonic() - started) * 1000
        if self.on_update is not None:
            self.on_update(state)

    async def _fetch(self, target: _Target) -> Snapshot:
        return _parse(await self._get(target.url, target.headers, MAX_SNAPSHOT_BYTES))

    async def _get(self, url: str, headers: dict[str, str], max_bytes: int) -> bytes:
        """One GET answered 200 in full within the timeout and `max_bytes`, or PollError."""
        assert self._session is not None, "use the collector as an async context manager"
        try:
            async with self._session.get(url, headers=headers) as resp:
                self._check_status(resp.status)
                body = await capped_body(resp, max_bytes)
                if body is None:
                    raise PollError(f"answer larger than {size_from_bytes(max_bytes)}")
        except TimeoutError:
            raise PollError(f"no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientConnectorError:
            raise PollError("connection refused") from None
        except aiohttp.ClientError as exc:
            raise PollError(f"{exc.__class__.__name__}: {exc}"[:200]) from None
        return body

    async def roles(self, found: Callable[[str, str], None], at_once: int = 16) -> None:
        """Ask every agent what our token may do (GET /v1/whoami), `at_once` at a time, and
        call `found(node, role)` for each answer; an agent that gives none is left out.

        Over the collector's own session: one client, one TLS context, for the fleet. A
        client per node cost 28 ms and 0.8 MiB each to build; at 1,000 nodes that held the
        first screen back 28 s and grew the console by 800 MiB (issue 15).
        """
        gate = asyncio.Semaphore(at_once)

        async def ask(target: _Target) -> None:
            url = target.url.removesuffix("/v1/snapshot") + "/v1/whoami"
            async with gate:
                try:
                    answer = json.loads(await self._get(url, target.headers, MAX_WHOAMI_BYTES))
                except (PollError, ValueError):
                    return
            role = answer.get("role") if isinstance(answer, dict) else None
            if isinstance(role, str):
                found(target.node.name, role)

        await asyncio.gather(*(ask(t) for t in self._targets))


def _parse(body: bytes) -> Snapshot:
    try:
        return decode_snapshot(body)
    except SnapshotError as exc:
        raise PollError(str(exc)) from None
