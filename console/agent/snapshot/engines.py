"""The engines on this node: declared deployments plus discovered processes, probed
concurrently, each within a bounded deadline, and turned into windowed model stats."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil

from console.agent.snapshot.discovery import EngineProcess, alive
from console.core.config.load import Fleet
from console.core.metrics.readings import EngineReading
from console.core.metrics.window import ModelWindow
from console.core.wire import Engine
from plugins.base import EnginePlugin, EngineTarget, ProbeContext

log = logging.getLogger(__name__)

# A discovered engine whose process is gone stays listed as down this long, then goes.
FORGET_AFTER_S = 300.0
# The unasked exits an engine keeps (the crash-loop diagnosis counts them in its window):
# the newest this many, none older than this.
EXITS_KEPT = 32
EXITS_KEPT_S = 3600.0


def _port(url: str) -> int | None:
    parts = urlsplit(url)
    if parts.port:
        return parts.port
    return 443 if parts.scheme == "https" else 80 if parts.scheme == "http" else None


def engine_id(kind: str, endpoint: str) -> str:
    """Stable and readable on one node: "vllm-8001", "triton-8000"."""
    return f"{kind}-{_port(endpoint)}"


@dataclass(slots=True)
class Tracked:
    target: EngineTarget
    deployment_ids: list[str] = field(default_factory=list)
    process: EngineProcess | None = None
    discovered: bool = False
    windows: dict[str, ModelWindow] = field(default_factory=dict)
    gone_since: float | None = None
    profile: str | None = None  # started by this agent from this launch profile
    # The API server process's CPU at the last probe: (pid, create time, monotonic s, CPU s)
    cpu_mark: tuple[int, float, float, float] | None = None
    # When its process exited with no stop asked (wall clock), newest last; and the
    # process whose end is already counted (or was asked for), so it counts once.
    exits: deque[float] = field(default_factory=lambda: deque(maxlen=EXITS_KEPT))
    ended: tuple[int, float] | None = None

    def process_ended(self, now: float, asked: bool) -> None:
        """Its process is gone (seen dead, or replaced by a new one): an exit, once."""
        proc = self.process
        if proc is None or self.ended == (proc.pid, proc.create_time):
            return
        self.ended = (proc.pid, proc.create_time)
        if not asked:
            self.exits.append(now)

    def recent_exits(self, now: float) -> list[float]:
        while self.exits and self.exits[0] < now - EXITS_KEPT_S:
            self.exits.popleft()
        return list(self.exits)


class EngineTracker:
    def __init__(self, fleet: Fleet, node: str, plugins: dict[str, EnginePlugin]) -> None:
        self.plugins = plugins
        self.settings = fleet.agent
        self.ctx = ProbeContext(None, fleet.agent.probe_timeout_s, fleet.agent.max_response_bytes)
        self.tracked: dict[str, Tracked] = {}
        # Whether an engine has a job under way (a stop, a restart): its exit was asked for.
        # The job runner sets it (console/agent/api/app.py).
        self.busy: Callable[[str], bool] = lambda _engine: False
        for model, dep in fleet.deployments_on(node):
            key = engine_id(dep.engine, dep.endpoint)
            entry = self.tracked.get(key)
            if entry is None:
                entry = self.tracked[key] = Tracked(
                    EngineTarget(
                        id=key,
                        kind=dep.engine,
                        endpoint=dep.endpoint,
                        metrics_endpoint=dep.metrics_endpoint,
                    )
                )
            entry.deployment_ids.append(dep.id)
            entry.target.engine_models.append(dep.engine_model or model.name)

    def merge(self, processes: list[EngineProcess], now: float) -> None:
        """Attach discovered processes to tracked engines, adding the undeclared ones."""
        for proc in processes:
            if proc.kind not in self.plugins:
                continue
            key = engine_id(proc.kind, proc.where.endpoint)
            entry = self.tracked.get(key)
            if entry is None:
                entry = self.tracked[key] = Tracked(
                    EngineTarget(
                        id=key,
                        kind=proc.kind,
                        endpoint=proc.where.endpoint,
                        metrics_endpoint=proc.where.metrics_endpoint,
                    ),
                    discovered=True,
                )
            old = entry.process
            if old is not None and (old.pid, old.create_time) != (proc.pid, proc.create_time):
                # A new process on its port: the old one ended (restarted by a supervisor
                # between two looks, its exit maybe never seen by a probe).
                entry.process_ended(now, self.busy(key))
            entry.process = proc
            entry.target.pid = proc.pid
            if entry.target.metrics_endpoint is None:
                entry.target.metrics_endpoint = proc.where.metrics_endpoint
            entry.gone_since = None

    def manage(self, target: EngineTarget, process: EngineProcess, profile: str) -> None:
        """Track an engine this agent started, from its first second (it shows as loading)."""
        entry = self.tracked.get(target.id)
        if entry is None:
            entry = self.tracked[target.id] = Tracked(target, discovered=True)
        entry.process_ended(time.time(), asked=True)  # a restart's old process: asked for
        entry.profile = profile
        entry.process = process
        entry.target.pid = process.pid
        entry.gone_since = None

    async def release(self, engine_id: str) -> None:
        """An engine this agent stopped on purpose: a declared deployment stays (as down),
        anything else leaves the list now."""
        entry = self.tracked.get(engine_id)
        if entry is None:
            return
        entry.process_ended(time.time(), asked=True)
        # Stopped on purpose: no process of its own now, so it reads down, not "exited".
        entry.process, entry.target.pid = None, None
        entry.profile = None
        if not entry.deployment_ids:
            del self.tracked[engine_id]
            plugin = self.plugins.get(entry.target.kind)
            if plugin is not None:
                await plugin.forget(engine_id)

    def pids(self) -> dict[int, str]:
        return {e.process.pid: key for key, e in self.tracked.items() if e.process is not None}

    async def probe_all(self, now: float) -> list[Engine]:
        entries = list(self.tracked.values())
        engines = await asyncio.gather(*(self._probe(e, now) for e in entries))
        await self._drop_forgotten(now)
        return sorted(engines, key=lambda e: e.id)

    async def _probe(self, entry: Tracked, now: float) -> Engine:
        plugin = self.plugins.get(entry.target.kind)
        if plugin is None:
            return Engine(
                id=entry.target.id,
                kind=entry.target.kind,
                state="down",
                endpoint=entry.target.endpoint,
                deployment_ids=entry.deployment_ids,
                reason=f"no plugin for engine kind {entry.target.kind!r}",
            )
        limit = self.ctx.timeout * 3  # a probe makes at most two rounds of bounded calls
        started = time.perf_counter()
        try:
            reading = await asyncio.wait_for(plugin.probe(entry.target, self.ctx), limit)
        except TimeoutError:
            reading = EngineReading(
                state="unhealthy", reason=f"probe did not finish within {limit:g} s"
            )
        except Exception as exc:  # a plugin bug must not stop the agent
            log.exception("probe of %s failed", entry.target.id)
            reading = EngineReading(state="unhealthy", reason=f"probe failed: {exc!r}"[:300])
        probe_ms = (time.perf_counter() - started) * 1000
        self._apply_process(entry, reading, now)
        engine = Engine(
            id=entry.target.id,
            kind=entry.target.kind,
            endpoint=entry.target.endpoint,
            version=reading.version,
            state=reading.state,
            reason=reading.reason,
            pid=entry.process.pid if entry.process else None,
            deployment_ids=entry.deployment_ids,
            discovered=entry.discovered,
            config=reading.config,
            probe_ms=round(probe_ms, 2),
            profile=entry.profile,
            api_server_cpu_pct=_api_server_cpu(entry, plugin, reading.state),
            exits=entry.recent_exits(now),
        )
        for model in reading.models:
            window = entry.windows.get(model.name)
            if window is None:
                window = entry.windows[model.name] = ModelWindow(self.settings.window_s)
            window.add(now, model)
            engine.models.append(window.stats())
        return engine

    def _apply_process(self, entry: Tracked, reading: EngineReading, now: float) -> None:
        proc = entry.process
        if proc is None:
            return
        if alive(proc.pid, proc.create_time):
            if reading.state == "down":
                # vLLM and trtllm-serve open their port only once the model is loaded.
                reading.state = "loading"
                reading.reason = (
                    f"process {proc.pid} is running but its port does not "
                    f"answer yet ({reading.reason})"
                )
            return
        entry.process_ended(now, self.busy(entry.target.id))
        reading.state = "down"
        reading.reason = f"process {proc.pid} exited" + (
            f"; {reading.reason}" if reading.reason else ""
        )
        reading.models = []
        if entry.gone_since is None:
            entry.gone_since = now

    async def _drop_forgotten(self, now: float) -> None:
        for key, entry in list(self.tracked.items()):
            if (
                entry.discovered
                and not entry.deployment_ids
                and entry.gone_since is not None
                and now - entry.gone_since > FORGET_AFTER_S
            ):
                del self.tracked[key]
                plugin = self.plugins.get(entry.target.kind)
                if plugin is not None:
                    await plugin.forget(key)


def _api_server_cpu(entry: Tracked, plugin: EnginePlugin, state: str) -> float | None:
    """% of one core the engine's API server process used since the last probe (its own
    threads, not its children: vLLM's EngineCore is one). None on the first probe of a
    process, and where the process is gone or is not the API server alone."""
    proc = entry.process
    if proc is None or state == "down" or not plugin.api_server_process(proc.cmdline):
        entry.cpu_mark = None
        return None
    try:
        times = psutil.Process(proc.pid).cpu_times()
    except psutil.Error:
        entry.cpu_mark = None
        return None
    at, used = time.monotonic(), times.user + times.system
    mark, entry.cpu_mark = entry.cpu_mark, (proc.pid, proc.create_time, at, used)
    if mark is None or mark[:2] != (proc.pid, proc.create_time):
        return None
    if at <= mark[2] or used < mark[3]:
        return None
    return round(100 * (used - mark[3]) / (at - mark[2]), 2)
