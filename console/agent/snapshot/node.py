"""The agent's snapshot cycle: GPUs, host and engines, sampled together every interval.

The cycle reschedules itself only after the previous one finished, so a hung engine or a
slow NVML call never piles up work. NVML and the host's disk statistics each run on their
own thread with a deadline (console.agent.snapshot.watched): a GPU that hangs the driver, or a
hung mount, leaves the last good values in place, marked, and the HTTP API keeps
answering.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from contextlib import suppress

import aiohttp

from console import __version__
from console.agent.snapshot import discovery
from console.agent.snapshot.engines import EngineTracker
from console.agent.snapshot.gpu import GpuSampler
from console.agent.snapshot.gpu_inventory import GpuInventory
from console.agent.snapshot.host import HostSampler
from console.agent.snapshot.watched import Watched
from console.core.config.load import Fleet
from console.core.fetch import new_session
from console.core.wire import Gpu, Host, Job, NodeInfo, Snapshot, TrtEngine
from plugins import load_plugins, plugin_failures

log = logging.getLogger(__name__)

DISCOVER_EVERY_S = 10.0
NVML_DEADLINE_S = 5.0
HOST_DEADLINE_S = 5.0


class NodeAgent:
    def __init__(self, fleet: Fleet, node: str, gpu: GpuSampler | None = None) -> None:
        fleet.node(node)  # a clear error for a node the file does not declare
        self.fleet = fleet
        self.node = node
        self.settings = fleet.agent
        self.plugins = load_plugins()
        self.gpu = gpu if gpu is not None else GpuSampler()
        self.host = HostSampler(self.settings.disk_paths)
        self.http: aiohttp.ClientSession | None = None  # made in the loop, at the first cycle
        self.engines = EngineTracker(fleet, node, self.plugins)
        self.owners = discovery.Owners()
        self._nvml: Watched[list[Gpu]] = Watched(
            "NVML", "GPU values", self.gpu.read, NVML_DEADLINE_S, []
        )
        self._disks: Watched[Host] = Watched(
            "host statistics", "host values", self.host.sample, HOST_DEADLINE_S, Host()
        )
        self._last_discovery = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self.latest: Snapshot | None = None
        self.cycles = 0
        self._json: tuple[Snapshot | None, bytes] = (None, b"")
        self._updated = asyncio.Event()  # set when a new snapshot lands, then replaced
        self.jobs_view: Callable[[], list[Job]] | None = None  # the job runner's, if any
        self.trt_view: Callable[[], list[TrtEngine]] | None = None  # the drill runner's
        # The GPUs the node had, kept in the state folder by the serving agent (JobRunner
        # opens it); None: not kept (`agent --once`), and no GPU is said to be gone.
        self.inventory: GpuInventory | None = None

    async def cycle(self) -> Snapshot:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        now = time.time()
        if self.http is None:
            self.http = self.engines.ctx.http = new_session()
        if self.settings.discover and now - self._last_discovery >= DISCOVER_EVERY_S:
            self._last_discovery = now
            processes = await asyncio.to_thread(discovery.scan, self.plugins)
            self.engines.merge(processes, now)
        gpus_task = asyncio.ensure_future(self._sample_gpus())
        host_task = asyncio.ensure_future(self._disks.call())
        engines = await self.engines.probe_all(now)
        gpus, gpu_status, nvml_ms = await gpus_task
        gone = []
        if self.inventory is not None and gpu_status == "ok":  # a list NVML gave just now
            gone = self.inventory.check(gpus, now)
        host, host_problem, _ = await host_task
        if host_problem is not None:
            host = host.model_copy(update={"error": host_problem})
        owners = self.engines.pids()
        seen: set[int] = set()
        for gpu in gpus:
            for proc in gpu.processes or []:
                seen.add(proc.pid)
                proc.engine_id, proc.name = self.owners.owner(proc.pid, owners)
        self.owners.forget_except(seen)
        snapshot = Snapshot(
            node=NodeInfo(
                name=self.node, agent_version=__version__, time=now, hostname=socket.gethostname()
            ),
            host=host,
            gpu_status=gpu_status,
            driver_version=self.gpu.driver_version,
            cuda_driver_version=self.gpu.cuda_driver_version,
            gpus=gpus,
            gpus_gone=gone,
            engines=engines,
            jobs=self.jobs_view() if self.jobs_view is not None else [],
            trt_engines=self.trt_view() if self.trt_view is not None else [],
            # An engine plugin that did not load: its engines go unseen on this node.
            missing=[f"{f.kind} engines: {f}" for f in plugin_failures()],
        )
        snapshot.cycle = {
            "wall_ms": round((time.perf_counter() - wall0) * 1000, 3),
            "cpu_ms": round((time.process_time() - cpu0) * 1000, 3),
            "nvml_ms": nvml_ms,
            "interval_s": self.settings.scrape_interval_s,
        }
        self.latest = snapshot
        self.cycles += 1
        self._updated.set()
        self._updated = asyncio.Event()
        return snapshot

    def latest_json(self) -> bytes:
        """The newest snapshot as JSON, serialized once per cycle however many read it."""
        snap = self.latest
        if snap is None:
            return b""
        if self._json[0] is not snap:
            self._json = (snap, snap.model_dump_json().encode())
        return self._json[1]

    async def next_snapshot(self, after: Snapshot | None) -> Snapshot:
        """The first snapshot newer than `after` (waits for the next cycle if needed)."""
        while self.latest is None or self.latest is after:
            await self._updated.wait()
        return self.latest

    @property
    def nvml_deadline_s(self) -> float:
        return self._nvml.deadline_s

    @nvml_deadline_s.setter
    def nvml_deadline_s(self, value: float) -> None:
        self._nvml.deadline_s = value

    async def fresh_gpus(self) -> tuple[list[Gpu], str]:
        """A new NVML read for a preflight (the snapshot may be an interval old)."""
        gpus, status, _ = await self._sample_gpus()
        return gpus, status

    async def _sample_gpus(self) -> tuple[list[Gpu], str, float | None]:
        if not self.gpu.available:
            return [], self.gpu.status, None
        gpus, problem, ms = await self._nvml.call()
        return gpus, problem or "ok", ms

    async def run(self) -> None:
        """Take a snapshot every interval, each one after the previous one finished."""
        interval = self.settings.scrape_interval_s
        while True:
            started = time.monotonic()
            try:
                await self.cycle()
            except Exception:  # the loop must outlive any one bad cycle
                log.exception("snapshot cycle failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="snapshot-cycle")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        for plugin in self.plugins.values():
            for key in list(self.engines.tracked):
                await plugin.forget(key)
        if self.http is not None:
            await self.http.close()
        self._nvml.close()
        self._disks.close()
        self.gpu.close()
