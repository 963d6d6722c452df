"""The SIMULATED demo fleet running: simulated GPUs and engines, watched by REAL agents.

Everything runs in one asyncio loop on 127.0.0.1. Per node: one real agent
(console.agent.snapshot.node.NodeAgent and console.agent.api.app.create_app, served by uvicorn)
whose
GpuSampler reads a SimulatedNvml, and whose engine plugins probe simulated engines over
HTTP, exactly as on a GPU node. Each simulated engine also has a tiny real process standing
in for its server process, so the agent maps GPU processes to engines the real way (by pid).
In front of them, the real gateway, with SIMULATED clients sending it traffic.

One model's engines (demo_layout.LAUNCHED) are not run here: each node's agent starts them
from their launch profiles, through its jobs API, as it would start vLLM on a GPU node
(console.sim.standin_vllm, a process of its own under the agent's supervisor). So the
agent owns them and can restart them: a rolling restart of that model runs for real
through the gateway, the agents and the simulated engines. Their GPUs show them while
they run (`LaunchedTenants`).

What runs where is console.sim.demo_layout; the fleet.toml it writes,
console.sim.demo_fleetfile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import uvicorn

from console.agent.api.app import create_app
from console.agent.api.auth import Tokens
from console.agent.jobs.runner import JobRunner
from console.agent.snapshot.discovery import EngineProcess
from console.agent.snapshot.gpu import GpuSampler
from console.agent.snapshot.node import NodeAgent
from console.core.config.load import Fleet, load_fleet
from console.core.wire import Snapshot
from console.sim.demo_fleetfile import write_fleet_file
from console.sim.demo_layout import (
    AGENT_PORTS,
    ENGINE_PORTS,
    GATEWAY_PORT,
    GATEWAY_RATE,
    GPUS_PER_NODE,
    HOT_GPU,
    MODELS,
    XID,
    ModelInfo,
    ecc_gpu_of,
    plan,
    stands_for,
)
from console.sim.fleetfile import listen_socket, node_name, port_of, viewer_token_for
from console.sim.load import CLIENT_MARK, TICK_S, Routed, Workload, gpu_busy
from console.sim.nvml import GpuSpec, SimulatedNvml, Tenant
from console.sim.standin_vllm import MODEL_ENV, traffic_of
from console.sim.triton_engine import TritonEngine
from console.sim.vllm_engine import VllmEngine
from plugins.base import Discovered

STARTUP_S = 30.0
LAUNCH_S = 90.0  # the agents' start jobs of the launched model, all of them, at most
JOB_POLL_S = 0.2


class SimulatedNodeAgent(NodeAgent):
    """The real agent; only the host name in its snapshots says SIMULATED."""

    async def cycle(self) -> Snapshot:
        snapshot = await super().cycle()
        snapshot.node.hostname = f"{self.node}.simulated"
        return snapshot


class _EngineLoad:
    """What a GPU knows of an engine its agent started: its batch, as the agent last read
    it from the engine's metrics (the engine runs in a process of its own)."""

    def __init__(self, agent: NodeAgent, engine_id: str, max_seqs: int) -> None:
        self.agent, self.engine_id, self.max_seqs = agent, engine_id, max_seqs

    @property
    def batch(self) -> float:
        snapshot = self.agent.latest
        for engine in snapshot.engines if snapshot is not None else []:
            if engine.id == self.engine_id:
                return sum(m.requests_running or 0.0 for m in engine.models)
        return 0.0

    @property
    def gpu_busy(self) -> float:
        return gpu_busy(self.batch)

    @property
    def batch_fill(self) -> float:
        return min(1.0, self.batch / self.max_seqs)


class LaunchedTenants:
    """The GPU tenants of the engines a node's agent started (its supervisor's), for the
    node's SimulatedNvml: each engine process on the GPUs it was launched on, while it
    runs. Read at each NVML call, so an engine stopped for a restart has left its GPUs by
    the time the restart's preflight looks."""

    def __init__(self, agent: NodeAgent, runner: JobRunner) -> None:
        self.agent, self.runner = agent, runner
        # engine id -> (its session leader, its engine process, its load): an engine's
        # pid is read from its status file once per start, not at every NVML call.
        self._seen: dict[str, tuple[int, int, _EngineLoad]] = {}

    def __call__(self, index: int) -> list[Tenant]:
        tenants = []
        for managed in list(self.runner.supervisor.engines.values()):  # a copy: NVML's thread
            if index not in managed.gpus:
                continue
            seen = self._seen.get(managed.engine_id)
            if seen is None or seen[0] != managed.pgid:
                pid = managed.engine_pid()
                if pid is None:
                    continue  # spawned; its engine process not yet started
                profile = self.agent.fleet.profiles.get(managed.profile)
                shape = traffic_of(profile.env.get(MODEL_ENV) if profile else None)
                seen = (managed.pgid, pid, _EngineLoad(self.agent, managed.engine_id,
                                                       shape.max_seqs))  # fmt: skip
                self._seen[managed.engine_id] = seen
            if _running(seen[1]):
                tenants.append(Tenant(seen[1], seen[2], 0.9))
        return tenants


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handlers: the fleet stops every server itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _stand_in(bin_dir: Path, kind: str) -> subprocess.Popen[bytes]:
    """A tiny real process standing for an engine's server process.

    `cat` reading a pipe that only this process holds: it exits by itself when the
    simulation dies, however it dies, so nothing is left behind. Started through a link
    named sim-vllm or sim-triton, so the GPU process list shows what it stands for.
    """
    cat = Path(shutil.which("cat") or "/bin/cat")
    exe = bin_dir / f"sim-{kind}"
    if cat.resolve().name == "cat":  # a multi-call binary (busybox) dispatches on its name
        exe.unlink(missing_ok=True)
        exe.symlink_to(cat)
    else:
        exe = cat
    return subprocess.Popen(
        [str(exe)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=False,
    )


class DemoFleet:
    """A running SIMULATED fleet. `path` is its fleet.toml; `close()` stops everything."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.agents: dict[str, str] = {}  # node name -> agent URL
        self._engines: list[VllmEngine | TritonEngine] = []
        self._servers: list[tuple[_Server, asyncio.Task[None]]] = []
        self._children: list[subprocess.Popen[bytes]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._sockets: list[socket.socket] = []
        self._gateway_runner: Any = None
        self._clients: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DemoFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the gateway and the agents, then the engines, then the stand-in processes."""
        if self._clients is not None:
            self._clients.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._clients
            self._clients = None
        if self._gateway_runner is not None:
            await self._gateway_runner.cleanup()
            self._gateway_runner = None
        for server, _ in self._servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in self._servers), return_exceptions=True)
        self._servers = []
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        for engine in self._engines:
            await engine.stop()
        self._engines = []
        for child in self._children:
            if child.stdin is not None:
                child.stdin.close()
            child.kill()
            child.wait(timeout=5)
        self._children = []
        for sock in self._sockets:  # those a server never took over, after a failed start
            sock.close()
        self._sockets = []
        self.stop_started_engines()

    async def _start(self, nodes: int, token: str, window_s: float, verify_s: float | None) -> None:
        out_dir = self.path.parent
        bin_dir = out_dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        specs = plan(nodes)
        # Ports first: the fleet file names them, and the agents read the fleet file.
        http: list[socket.socket] = []
        metrics: list[socket.socket | None] = []
        per_node: dict[int, int] = {}
        for spec in specs:
            slot = per_node[spec.node] = per_node.get(spec.node, -1) + 1
            base = ENGINE_PORTS + 20 * spec.node + slot
            http.append(listen_socket(base))
            metrics.append(listen_socket(base + 10) if spec.kind == "triton" else None)
        agent_socks = [listen_socket(AGENT_PORTS + i) for i in range(nodes)]
        gateway_sock = listen_socket(GATEWAY_PORT)
        self._sockets = [*http, *(m for m in metrics if m), *agent_socks, gateway_sock]
        write_fleet_file(
            self.path, specs, http, metrics, agent_socks, gateway_sock, window_s, verify_s
        )
        fleet = load_fleet(self.path)  # the same validation as any fleet file
        for spec, sock in zip(specs, http, strict=True):
            if spec.launched:  # its port, free for the engine its agent starts
                self._sockets.remove(sock)
                sock.close()

        start = time.monotonic()
        workloads: dict[int, Workload] = {}
        children: dict[int, subprocess.Popen[bytes]] = {}
        for i, (spec, sock, msock) in enumerate(zip(specs, http, metrics, strict=True)):
            if spec.launched:
                continue  # its node's agent starts it (_start_launched)
            # Its traffic is what the gateway sends it (console.sim.load, routed traffic).
            routed = Routed(stands_for(specs, spec.model), prior=spec.traffic.rate)
            workload = Workload(
                spec.traffic, seed=i, start=start, responses=msock is not None, routed=routed
            )
            workloads[i] = workload
            children[i] = _stand_in(bin_dir, spec.kind)
            self._children.append(children[i])
            if msock is not None:
                triton = TritonEngine(workload, spec.model.name)
                self._engines.append(triton)
                await triton.start(sock, msock)
            else:
                vllm = VllmEngine(workload, spec.model.name, gpus=len(spec.gpus))
                self._engines.append(vllm)
                await vllm.start(sock)
        self._ticker = asyncio.create_task(self._tick(list(workloads.values())), name="sim-traffic")

        for node in range(nodes):
            mine = [i for i, spec in enumerate(specs) if spec.node == node and i in children]
            gpus = [GpuSpec() for _ in range(GPUS_PER_NODE)]
            processes = []
            for i in mine:
                child, spec = children[i], specs[i]
                memory = 0.92 if spec.kind == "triton" else 0.9
                for g in spec.gpus:
                    gpus[g].tenants.append(Tenant(child.pid, workloads[i], memory))
                metrics_url = f"http://127.0.0.1:{port_of(m)}" if (m := metrics[i]) else None
                where = Discovered(f"http://127.0.0.1:{port_of(http[i])}", metrics_url)
                proc = psutil.Process(child.pid)
                processes.append(
                    EngineProcess(spec.kind, child.pid, proc.create_time(), proc.cmdline(), where)
                )
            if node == HOT_GPU[0]:
                gpus[HOT_GPU[1]].hot = True
            ecc_node, ecc_gpu = ecc_gpu_of(nodes)
            if node == ecc_node:
                gpus[ecc_gpu].ecc_uncorrected = 2
                gpus[ecc_gpu].xid = XID
            await self._start_agent(fleet, node, gpus, processes, agent_socks[node], token)
        await self._wait_started()
        await self._start_launched(fleet, token)
        await self._start_gateway(fleet, gateway_sock, token)

    async def _start_agent(
        self,
        fleet: Fleet,
        node: int,
        gpus: list[GpuSpec],
        processes: list[EngineProcess],
        sock: socket.socket,
        token: str,
    ) -> None:
        name = node_name(node, 2)
        nvml = SimulatedNvml(name, gpus, seed=node)
        agent = SimulatedNodeAgent(fleet, name, gpu=GpuSampler(nvml))
        agent.engines.merge(processes, time.time())
        settings = fleet.agent
        # The demo token is an operator token (operators may also read), and its viewer
        # token reads only (the web view's); passed explicitly, so nothing is read from or
        # left in this process's environment.
        tokens = Tokens.from_env(
            settings.viewer_token_env,
            settings.operator_token_env,
            environ={
                settings.operator_token_env: token,
                settings.viewer_token_env: viewer_token_for(token),
            },
        )
        runner = JobRunner.open(agent)
        nvml.launched = LaunchedTenants(agent, runner)
        config = uvicorn.Config(
            create_app(agent, tokens, runner=runner),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"agent-{name}")
        self._servers.append((server, task))
        self.agents[name] = f"http://127.0.0.1:{port_of(sock)}"

    async def _start_gateway(self, fleet: Fleet, sock: socket.socket, token: str) -> None:
        """The real gateway in front of the simulated engines: `f` on Models fails over."""
        from aiohttp import web

        from console.gateway.server import Gateway

        gateway = Gateway(
            fleet,
            admin_token=token,
            viewer_token=viewer_token_for(token),
            state_dir=self.path.parent / "gateway",
        )
        # A short shutdown, as for the engines: a simulated client's stream that waits in a
        # surge's queue must not hold the fleet's exit for aiohttp's default minute.
        runner = web.AppRunner(
            gateway.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        await web.SockSite(runner, sock, shutdown_timeout=1.0).start()
        self._gateway_runner = runner
        url = f"http://127.0.0.1:{port_of(sock)}"
        self._clients = asyncio.create_task(_gateway_clients(url, list(MODELS.values())))

    async def _start_launched(self, fleet: Fleet, token: str) -> None:
        """The launched model's engines, each started by its node's agent from its launch
        profile (a vllm.start job, as `engineroom vllm start --wait` asks for it), all at
        once; returns when every job has succeeded. A job that fails stops the demo with
        the agent's words."""
        import aiohttp

        starts = [
            (self.agents[dep.node], dep.profile, dep.id)
            for model in fleet.models
            for dep in model.deployments
            if dep.profile is not None and dep.weight > 0 and dep.node in self.agents
        ]  # the standbys (weight 0) wait for an operator
        headers = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + LAUNCH_S

        async def start(http: aiohttp.ClientSession, agent: str, profile: str, dep: str) -> None:
            body = {"kind": "vllm.start", "profile": profile, "overrides": {}}
            async with http.post(f"{agent}/v1/jobs", json=body, headers=headers) as resp:
                job = await resp.json()
                if resp.status != 202:
                    raise RuntimeError(f"{dep}: the agent refused its start: {job.get('error')}")
            while True:
                async with http.get(f"{agent}/v1/jobs/{job['id']}", headers=headers) as resp:
                    job = await resp.json()
                if job["state"] == "succeeded":
                    return
                if job["state"] in ("failed", "cancelled"):
                    raise RuntimeError(f"{dep}: its start job {job['state']}: {job.get('error')}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{dep}: its engine did not start within {LAUNCH_S:g} s")
                await asyncio.sleep(JOB_POLL_S)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await asyncio.gather(*(start(http, *s) for s in starts))

    async def _wait_started(self) -> None:
        """Until every agent serves (each has taken its first snapshot by then)."""
        deadline = time.monotonic() + STARTUP_S
        while not all(server.started for server, _ in self._servers):
            for _, task in self._servers:
                if task.done():
                    task.result()  # raises what stopped it
                    raise RuntimeError("a simulated node's agent stopped while starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the simulated agents did not start within {STARTUP_S:g} s")
            await asyncio.sleep(0.05)

    @staticmethod
    async def _tick(workloads: list[Workload]) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            for workload in workloads:
                workload.tick(now)
                # One engine's second at a time: the gateway and the engines' streams in
                # this loop wait for one tick, not for twenty.
                await asyncio.sleep(0)

    def stop_started_engines(self) -> None:
        """The engines the demo's agents started: they outlive agents by design, not demos."""
        killed = []
        for record in (self.path.parent / "state").glob("*/engines/*/engine.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                pgid = int(json.loads(record.read_text())["pgid"])
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
        for pgid in killed:  # a log capper this process's agents spawned: reaped here
            with contextlib.suppress(OSError):
                os.waitpid(pgid, 0)


GATEWAY_INFLIGHT = 32  # per model: beyond it an arrival is not sent (a bound, not a queue)


async def _gateway_clients(url: str, models: list[ModelInfo]) -> None:
    """SIMULATED clients: a light stream of requests per model through the gateway, so its
    own TTFT (TTFT95 at the gateway on Models) and a failover's verification have traffic
    to see.

    Arrivals are open-loop (Poisson, at a steady rate), like many independent users: a
    client that waited for each answer before sending the next would send fewer requests
    while a deployment is slow, and the gateway's p95 would miss the slow moments that
    the engine's histogram counts (coordinated omission)."""
    import random

    import aiohttp

    rng = random.Random(7)

    async def one(model: str) -> None:
        # CLIENT_MARK: the engine that serves it counts it as many users' requests.
        body = {"model": model, "prompt": f"{CLIENT_MARK}: hello", "max_tokens": 8,
                "stream": True}  # fmt: skip
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.post(url + "/v1/completions", json=body) as resp:
                async for _ in resp.content.iter_any():
                    pass

    async def arrivals(model: str) -> None:
        inflight: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(rng.expovariate(GATEWAY_RATE))
                if len(inflight) < GATEWAY_INFLIGHT:
                    task = asyncio.create_task(one(model))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
        finally:
            for task in list(inflight):
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await asyncio.gather(*(arrivals(m.name) for m in models))


async def serve_demo_fleet(
    out_dir: Path,
    nodes: int = 4,
    *,
    token: str,
    window_s: float = 60.0,
    verify_s: float | None = None,
) -> DemoFleet:
    """Start the SIMULATED demo fleet in this event loop; its fleet file is `.path`.

    Writes out_dir/fleet.toml. The caller stops it with `await fleet.close()` (or uses it
    as `async with`). `token` (8 characters or more) is every agent's operator token.
    `window_s`: the agents' window for rates and percentiles; `verify_s`: every model's
    failover check window (None: each model's own). Tests shorten both.
    """
    if nodes < 1:
        raise ValueError("a fleet needs at least one node")
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    fleet = DemoFleet(out_dir / "fleet.toml")
    try:
        await fleet._start(nodes, token, window_s, verify_s)
    except BaseException:
        await fleet.close()
        raise
    return fleet
