"""The SIMULATED demo fleet: simulated GPUs and engines, watched by REAL agents.

Everything runs in one asyncio loop on 127.0.0.1. Per node: one real agent
(console.agent.node.NodeAgent and console.agent.app.create_app, served by uvicorn) whose
GpuSampler reads a SimulatedNvml, and whose engine plugins probe simulated engines over
HTTP, exactly as on a GPU node. Each simulated engine also has a tiny real process standing
in for its server process, so the agent maps GPU processes to engines the real way (by pid).

Nodes are gpu-a1, gpu-a2, gpu-b1, ... with 8 H200s each. llama-3.1-8b-instruct is served by
Triton (TensorRT-LLM) and by vLLM on different nodes; three more models run on vLLM. On
purpose: one GPU runs hot, one has an uncorrected ECC error (and an XID now and then), one
mistral deployment breaches its TTFT SLO periodically and one llama-70b deployment's queue
grows for a while.
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
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import uvicorn

from console.agent.app import create_app
from console.agent.auth import Tokens
from console.agent.discovery import EngineProcess
from console.agent.gpu import GpuSampler
from console.agent.jobs import JobRunner
from console.agent.node import NodeAgent
from console.core.config import Fleet, load_fleet
from console.core.wire import Snapshot
from console.sim import nvml, trtllm_double
from console.sim.fleetfile import (
    TOKEN_ENV,
    VIEWER_TOKEN_ENV,
    FleetText,
    listen_socket,
    model_tables,
    node_name,
    port_of,
    viewer_token_for,
)
from console.sim.load import (
    CLIENT_MARK,
    STANDS_FOR_ENV,
    TICK_S,
    Routed,
    Traffic,
    Workload,
)
from console.sim.nvml import GpuSpec, SimulatedNvml, Tenant
from console.sim.triton_engine import ENSEMBLE, TritonEngine
from console.sim.vllm_engine import VllmEngine
from plugins.base import Discovered

GPUS_PER_NODE = 8
ENGINE_PORTS, AGENT_PORTS = 18000, 19400  # preferred; each node gets 20 engine ports
GATEWAY_PORT = 19390
STARTUP_S = 30.0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    short: str  # for deployment ids: "llama8b-vllm-a2"
    slo: dict[str, float]
    vllm: Traffic
    triton: Traffic | None = None


MODELS = {
    m.short: m
    for m in (
        ModelInfo(
            "llama-3.1-8b-instruct",
            "llama8b",
            {"ttft_p95_ms": 500, "itl_p95_ms": 60, "error_rate": 0.01},
            # KV caches an H200 holds for an 8B model: one replica can take the model's
            # traffic in a failover without filling it.
            vllm=Traffic(6.0, 1500, 250, 128, 300_000, 0.09, 0.011),
            triton=Traffic(7.0, 1500, 220, 128, 320_000, 0.07, 0.009, max_output=256),
        ),
        ModelInfo(
            "llama-3.1-70b-instruct",
            "llama70b",
            {"ttft_p95_ms": 1500, "itl_p95_ms": 80, "error_rate": 0.01},
            vllm=Traffic(2.5, 2000, 350, 64, 160_000, 0.35, 0.028),
        ),
        ModelInfo(
            "mistral-7b-instruct-v0.3",
            "mistral7b",
            {"ttft_p95_ms": 300, "itl_p95_ms": 40, "error_rate": 0.01},
            vllm=Traffic(10.0, 600, 180, 256, 200_000, 0.05, 0.008),
        ),
        ModelInfo(
            "qwen2.5-32b-instruct",
            "qwen32b",
            {"ttft_p95_ms": 1000, "itl_p95_ms": 70, "error_rate": 0.01},
            vllm=Traffic(3.0, 1200, 300, 128, 220_000, 0.18, 0.02),
        ),
    )
}

# What each node runs, by its position modulo 4: (engine kind, model, GPUs).
LAYOUTS: tuple[tuple[tuple[str, str, tuple[int, ...]], ...], ...] = (
    (
        ("triton", "llama8b", (0,)),
        ("vllm", "llama70b", (2, 3)),
        ("vllm", "mistral7b", (4,)),
        ("vllm", "qwen32b", (6, 7)),
    ),
    (
        ("vllm", "llama8b", (0,)),
        ("vllm", "llama70b", (1, 2)),
        ("vllm", "qwen32b", (4, 5)),
        ("vllm", "mistral7b", (6,)),
    ),
    (
        ("triton", "llama8b", (0,)),
        ("vllm", "llama8b", (1,)),
        ("vllm", "llama70b", (2, 3)),
        ("vllm", "qwen32b", (4, 5)),
        ("vllm", "mistral7b", (6,)),
    ),
    (
        ("vllm", "llama8b", (0,)),
        ("vllm", "mistral7b", (1,)),
        ("vllm", "llama70b", (2, 3)),
        ("vllm", "qwen32b", (4, 5)),
        ("triton", "llama8b", (6,)),
    ),
)

# (node, model, GPU) of the demo's launch profiles: vLLM standbys on GPUs left idle.
STANDBYS = (
    (0, "llama8b", 1),  # beside gpu-a1's Triton/TensorRT-LLM llama: the failover standby
    (1, "mistral7b", 7),
)
HOT_GPU = (0, 2)  # (node, GPU): a llama-70b shard with poor cooling
XID = 94  # contained uncorrectable ECC error, as Hopper reports it


@dataclass(slots=True)
class EngineSpec:
    node: int
    kind: str
    model: ModelInfo
    gpus: tuple[int, ...]
    traffic: Traffic

    @property
    def deployment_id(self) -> str:
        label = "trt" if self.kind == "triton" else self.kind
        return f"{self.model.short}-{label}-{node_name(self.node, 2).removeprefix('gpu-')}"


def plan(nodes: int) -> list[EngineSpec]:
    """Every engine of a fleet of `nodes` nodes, with the incidents placed on purpose."""
    incident_node = 1 if nodes > 1 else 0
    specs = []
    for node in range(nodes):
        for kind, short, gpus in LAYOUTS[node % len(LAYOUTS)]:
            model = MODELS[short]
            traffic = model.triton if kind == "triton" and model.triton else model.vllm
            if node == 0 and short == "mistral7b":
                traffic = replace(traffic, ttft_breach=True)
            if node == incident_node and short == "llama70b":
                traffic = replace(traffic, queue_surge=True)
            specs.append(EngineSpec(node, kind, model, gpus, traffic))
    return specs


def _ecc_gpu(nodes: int) -> tuple[int, int]:
    return (1, 6) if nodes > 1 else (0, 5)


class SimulatedNodeAgent(NodeAgent):
    """The real agent; only the host name in its snapshots says SIMULATED."""

    async def cycle(self) -> Snapshot:
        snapshot = await super().cycle()
        snapshot.node.hostname = f"{self.node}.simulated"
        return snapshot


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
        self._standby_list: list[dict[str, Any]] | None = None

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

    async def _start(self, nodes: int, token: str) -> None:
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
        self._write(specs, http, metrics, agent_socks, gateway_sock)
        fleet = load_fleet(self.path)  # the same validation as any fleet file

        start = time.monotonic()
        workloads = []
        for i, (spec, sock, msock) in enumerate(zip(specs, http, metrics, strict=True)):
            # Its traffic is what the gateway sends it (console.sim.load, routed traffic).
            routed = Routed(stands_for(specs, spec.model), prior=spec.traffic.rate)
            workload = Workload(
                spec.traffic, seed=i, start=start, responses=msock is not None, routed=routed
            )
            workloads.append(workload)
            self._children.append(_stand_in(bin_dir, spec.kind))
            if msock is not None:
                triton = TritonEngine(workload, spec.model.name)
                self._engines.append(triton)
                await triton.start(sock, msock)
            else:
                vllm = VllmEngine(workload, spec.model.name, gpus=len(spec.gpus))
                self._engines.append(vllm)
                await vllm.start(sock)
        self._ticker = asyncio.create_task(self._tick(workloads), name="sim-traffic")

        for node in range(nodes):
            mine = [i for i, spec in enumerate(specs) if spec.node == node]
            gpus = [GpuSpec() for _ in range(GPUS_PER_NODE)]
            processes = []
            for i in mine:
                child, spec = self._children[i], specs[i]
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
            ecc_node, ecc_gpu = _ecc_gpu(nodes)
            if node == ecc_node:
                gpus[ecc_gpu].ecc_uncorrected = 2
                gpus[ecc_gpu].xid = XID
            await self._start_agent(fleet, node, gpus, processes, agent_socks[node], token)
        await self._wait_started()
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
        agent = SimulatedNodeAgent(
            fleet, name, gpu=GpuSampler(SimulatedNvml(name, gpus, seed=node))
        )
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
        config = uvicorn.Config(
            create_app(agent, tokens, runner=JobRunner.open(agent)),
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

    def _write(
        self,
        specs: list[EngineSpec],
        http: list[socket.socket],
        metrics: list[socket.socket | None],
        agent_socks: list[socket.socket],
        gateway_sock: socket.socket,
    ) -> None:
        out = FleetText(DEMO_HEADER)
        out.add(
            "[fleet]",
            {"name": "demo (SIMULATED)", "environment": "staging", "refresh_s": 1.0},
        )
        out.add(
            "[gateway]",
            {
                "url": f"http://127.0.0.1:{port_of(gateway_sock)}",
                "token_env": TOKEN_ENV,
                "viewer_token_env": VIEWER_TOKEN_ENV,
                "state_dir": str(self.path.parent / "gateway"),
            },
        )
        out.add(
            "[agent]",
            {
                "scrape_interval_s": 2.0,
                "window_s": 60.0,
                "probe_timeout_s": 2.0,
                "discover": False,
                "operator_token_env": TOKEN_ENV,
                "viewer_token_env": VIEWER_TOKEN_ENV,
                "state_dir": str(self.path.parent / "state"),
            },
        )
        for i, sock in enumerate(agent_socks):
            out.add(
                "[[nodes]]",
                {
                    "name": node_name(i, 2),
                    "agent": f"http://127.0.0.1:{port_of(sock)}",
                    "token_env": TOKEN_ENV,
                },
            )
        models = []
        for model in MODELS.values():
            deployments: list[dict[str, object]] = []
            for spec, sock, msock in zip(specs, http, metrics, strict=True):
                if spec.model is not model:
                    continue
                deployments.append(
                    {
                        "id": spec.deployment_id,
                        "node": node_name(spec.node, 2),
                        "engine": spec.kind,
                        "endpoint": f"http://127.0.0.1:{port_of(sock)}",
                        "metrics_endpoint": (
                            f"http://127.0.0.1:{port_of(msock)}" if msock else None
                        ),
                        "engine_model": ENSEMBLE if spec.kind == "triton" else None,
                        "weight": 100,
                        "engine_dir": (
                            str(self.path.parent / "engines" / spec.deployment_id)
                            if spec.kind == "triton"
                            else None
                        ),
                    }
                )
            for standby in self._standbys(len(agent_socks)):
                if standby["short"] == model.short:
                    deployments.append(
                        {
                            "id": standby["profile"],
                            "node": standby["node"],
                            "engine": "vllm",
                            "endpoint": f"http://127.0.0.1:{standby['port']}",
                            "weight": 0,  # a standby: no traffic until a failover
                            "profile": standby["profile"],
                        }
                    )
            models.append((model.name, model.slo, deployments))
        model_tables(out, models)
        self._write_profiles(out, specs, len(agent_socks))
        self._write_drills(out, specs, http)
        self.path.write_text(out.text(), encoding="utf-8")

    def _standbys(self, nodes: int) -> list[dict[str, Any]]:
        """The demo's vLLM standbys: a profile and a weight-0 deployment each (ports fixed
        once, when the fleet file is written)."""
        if self._standby_list is None:
            self._standby_list = []
            for node, short, gpu in STANDBYS:
                if node >= nodes:
                    continue
                with listen_socket(ENGINE_PORTS + 20 * node + 15) as sock:
                    port = port_of(sock)  # free now; the agent's preflight checks it again
                self._standby_list.append(
                    {
                        "short": short,
                        "node": node_name(node, 2),
                        "gpu": gpu,
                        "port": port,
                        "profile": f"{short}-standby-{node_name(node, 2).removeprefix('gpu-')}",
                    }
                )
        return self._standby_list

    def _write_profiles(self, out: FleetText, specs: list[EngineSpec], nodes: int) -> None:
        """Launch profiles on GPUs the layout leaves idle, for "Start vLLM" in the demo.

        They launch console.sim.standin_vllm (SIMULATED): vLLM's log lines, then the
        simulated engine, whose traffic is what the gateway sends it (STANDS_FOR_ENV: how
        many users a client request stands for). The model directories hold only a
        config.json, for the preflight.
        """
        models_dir = self.path.parent / "models"
        for standby in self._standbys(nodes):
            model = MODELS[standby["short"]]
            directory = models_dir / standby["short"]
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "config.json").write_text('{"SIMULATED": true}\n')
            out.add(
                f"[profiles.{standby['profile']}]",
                {
                    "engine": "vllm",
                    "node": standby["node"],
                    "model": str(directory),
                    "served_model_name": model.name,
                    "port": standby["port"],
                    "gpus": [standby["gpu"]],
                    "command": [sys.executable, "-m", "console.sim.standin_vllm"],
                    "args": {"host": "127.0.0.1", "max_model_len": 8192, "dtype": "bfloat16"},
                    "overridable": ["port"],
                    "allowed_args": ["max_num_seqs", "gpu_memory_utilization"],
                    "stop_grace_s": 10.0,
                    "env": {STANDS_FOR_ENV: f"{stands_for(specs, model):.4g}"},
                },
            )

    def _write_drills(
        self, out: FleetText, specs: list[EngineSpec], http: list[socket.socket]
    ) -> None:
        """TensorRT-LLM engines with provenance, and a rebuild drill (all SIMULATED).

        Each Triton llama-8b deployment gets an engine directory: gpu-a1's was built for an
        older driver (REBUILD REQUIRED), gpu-c1's matches the node, and the last one has no
        manifest (unknown provenance). The drill for gpu-a1 runs the TensorRT-LLM test
        doubles of console/sim/trtllm_double.py; its candidate forwards to the simulated vLLM.
        """
        from console.agent import manifest

        root = self.path.parent
        checkpoint = root / "models" / "llama8b"
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / "config.json").write_text('{"SIMULATED": true}\n')
        weights = manifest.WeightsHasher(root / "weights-hashes.json").hash(checkpoint)
        triton = [s for s in specs if s.kind == "triton"]
        vllm = [(s, k) for s, k in zip(specs, http, strict=True) if s.kind == "vllm"]
        # The node's facts are its simulated NVML's; the stack's, the test double's.
        node = {
            "driver": nvml.DRIVER_VERSION,
            "gpu": nvml.GPU_NAME,
            "compute_capability": ".".join(map(str, nvml.COMPUTE_CAPABILITY)),
        }
        now = {**{k: default for k, (_, default) in trtllm_double.VERSIONS.items()}, **node}
        shapes: dict[str, object] = {
            "max_batch_size": 64,
            "max_input_len": 4096,
            "max_seq_len": 8192,
            "max_num_tokens": 8192,
        }
        for i, spec in enumerate(triton):
            link = root / "engines" / spec.deployment_id
            link.parent.mkdir(parents=True, exist_ok=True)
            facts = {**now, "driver": "570.133.20"} if i == 0 else now
            built_for = {**shapes, "max_batch_size": 128} if i else shapes  # not a1's drill's
            inputs = manifest.key_inputs(
                spec.model.name, weights, "engine", "bf16", 1, built_for, facts
            )
            key = manifest.build_key(inputs)
            hand_built = i == len(triton) - 1 and len(triton) > 1
            engine = link if hand_built else root / "engine-cache" / key
            engine.mkdir(parents=True, exist_ok=True)
            (engine / "config.json").write_text('{"version": "1.2.0", "SIMULATED": true}\n')
            (engine / "rank0.engine").write_bytes(b"SIMULATED" * 64)
            if hand_built:
                continue  # no manifest: unknown provenance
            manifest.write_manifest(
                engine,
                {
                    "schema": 1,
                    "build_key": key,
                    "built": time.time() - 86400 * (30 if i == 0 else 2),
                    "model": {
                        "name": spec.model.name,
                        "checkpoint": str(checkpoint),
                        "weights_sha256": weights,
                    },
                    "pipeline": "engine",
                    "precision": "bf16",
                    "tp_size": 1,
                    "shapes": built_for,
                    "versions": {
                        k: facts[k] for k in ("tensorrt_llm", "tensorrt", "cuda", "driver")
                    },
                    "gpu": {
                        "name": facts["gpu"],
                        "compute_capability": facts["compute_capability"],
                    },
                    "SIMULATED": True,
                },
            )
            if not link.is_symlink():
                link.symlink_to(engine)
        first = triton[0] if triton else None
        baseline = next(((s, k) for s, k in vllm if first and s.model is first.model), None)
        if first is None or baseline is None:
            return
        tools = root / "trtllm-double"
        subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("trtllm_double.py")),
                "install",
                str(tools / "bin"),
                str(tools / "examples"),
            ],
            check=True,
            capture_output=True,
        )
        with listen_socket(ENGINE_PORTS + 19) as sock:
            serve_port = port_of(sock)
        name = f"llama8b-bf16-{node_name(first.node, 2).removeprefix('gpu-')}"
        out.add(
            f"[drills.{name}]",
            {
                "model": first.model.name,
                "deployment": first.deployment_id,
                "checkpoint": str(checkpoint),
                "engine_cache": str(root / "engine-cache"),
                "examples_dir": str(tools / "examples"),
                "serve_port": serve_port,
                "env": {
                    "PATH": f"{tools / 'bin'}:{os.environ.get('PATH', '')}",
                    "TRTLLM_DOUBLE_UPSTREAM": f"http://127.0.0.1:{port_of(baseline[1])}",
                    "TRTLLM_DOUBLE_UPSTREAM_MODEL": first.model.name,
                    **trtllm_double.node_env(**node),  # the probe reports this node
                    "TRTLLM_DOUBLE_BUILD_S": "6",
                    "TRTLLM_DOUBLE_LOAD_S": "2",
                },
                # SIMULATED engines vary their answers' length: the first-N gate applies.
                "validate": {"max_tokens": 12, "min_exact_match": 0.0, "first_n": 4},
                "benchmark": {
                    "concurrency": [1, 4, 16],
                    "requests_per_level": 16,
                    "max_tokens": 24,
                },
            },
        )
        out.add(f"[drills.{name}.steps.preflight]", {"argv": ["trtllm-versions"]}, indent="  ")

    def stop_started_engines(self) -> None:
        """The engines the demo's agents started: they outlive agents by design, not demos."""
        for record in (self.path.parent / "state").glob("*/engines/*/engine.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(record.read_text())["pgid"]), signal.SIGKILL)


GATEWAY_RATE = 4.0  # SIMULATED client requests per second and model, through the gateway


def stands_for(specs: list[EngineSpec], model: ModelInfo) -> float:
    """Simulated requests per client request of `model`: its deployments' rates together
    (what the model's users send) over the clients' own rate through the gateway."""
    return sum(s.traffic.rate for s in specs if s.model is model) / GATEWAY_RATE


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


DEMO_HEADER = """
SIMULATED fleet, written by `python -m console.sim` (behind `engineroom demo`).

The agents are real engineroom agents; the GPUs (NVML), the engines (vLLM-like and
Triton/TensorRT-LLM-like servers) and their traffic are SIMULATED, all in one process on
127.0.0.1. This file is valid only while that process runs. The operator token for every node
(and the gateway's admin token) is in the environment variable ENGINEROOM_DEMO_TOKEN; the
viewer token the web view reads with, in ENGINEROOM_DEMO_VIEWER_TOKEN.
"""


async def serve_demo_fleet(out_dir: Path, nodes: int = 4, *, token: str) -> DemoFleet:
    """Start the SIMULATED demo fleet in this event loop; its fleet file is `.path`.

    Writes out_dir/fleet.toml. The caller stops it with `await fleet.close()` (or uses it
    as `async with`). `token` (8 characters or more) is every agent's operator token.
    """
    if nodes < 1:
        raise ValueError("a fleet needs at least one node")
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    fleet = DemoFleet(out_dir / "fleet.toml")
    try:
        await fleet._start(nodes, token)
    except BaseException:
        await fleet.close()
        raise
    return fleet
