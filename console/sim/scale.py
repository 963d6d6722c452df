"""The SIMULATED scale fleet: many lightweight agents in one process, for the console's bench.

Not the real agent: each simulated node answers only GET /healthz, GET /v1/snapshot, its
stream GET /v1/snapshot/stream, and GET /v1/whoami (the token is an operator's), with the
bearer-token check, on a port of its own on 127.0.0.1. Its snapshot is valid against
console.core.wire.Snapshot (8 GPUs, 2 engines with models and latency), is rebuilt with new
values every `refresh_s`, and is kept as ready-to-send bytes, so answering costs almost
nothing: a thousand nodes fit on a 2-core machine next to the console being measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import math
import random
import socket
import time
import uuid
from pathlib import Path
from typing import Any, cast

import httptools
import pydantic_core

from console import __version__
from console.core.oslimits import raise_open_files
from console.sim.fleetfile import (
    TOKEN_ENV,
    FleetText,
    listen_socket,
    model_tables,
    node_name,
    port_of,
)
from console.sim.nvml import MEM_MHZ, POWER_LIMIT_MW, TOTAL_MEMORY
from console.sim.triton_engine import ENSEMBLE, TRITON_VERSION
from console.sim.vllm_engine import VLLM_VERSION

AGENT_PORTS = 20000  # preferred: node i on 20000 + i
PER_RACK = 40
SLICES = 10  # snapshots are rebuilt a tenth of the fleet at a time, spreading the work
MODELS: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("llama-3.1-8b-instruct", "llama8b", {"ttft_p95_ms": 500, "itl_p95_ms": 60}),
    ("llama-3.1-70b-instruct", "llama70b", {"ttft_p95_ms": 1500, "itl_p95_ms": 80}),
    ("mistral-7b-instruct-v0.3", "mistral7b", {"ttft_p95_ms": 300, "itl_p95_ms": 40}),
    ("qwen2.5-32b-instruct", "qwen32b", {"ttft_p95_ms": 1000, "itl_p95_ms": 70}),
)


def _response(status: str, body: bytes, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


HEALTH = _response("200 OK", json.dumps({"status": "ok", "version": f"{__version__}-sim"}).encode())
UNAUTHORIZED = _response(
    "401 Unauthorized", b'{"error":"invalid token"}', "WWW-Authenticate: Bearer\r\n"
)
# The console asks every agent what its token may do when it starts (console.tui.app).
WHOAMI = _response("200 OK", b'{"name":"sim","role":"operator","jobs":false}')
NOT_FOUND = _response("404 Not Found", b'{"error":"not found"}')
NOT_ALLOWED = _response("405 Method Not Allowed", b'{"error":"method not allowed"}')
BAD_REQUEST = _response("400 Bad Request", b'{"error":"bad request"}', "Connection: close\r\n")


class _Engine:
    """One engine on a simulated node: where it is, what it serves, on which GPUs."""

    def __init__(self, node: str, kind: str, port: int, model: int, gpus: range) -> None:
        self.kind = kind
        self.id = f"{kind}-{port}"
        self.model = MODELS[model]
        self.served = ENSEMBLE if kind == "triton" else self.model[0]
        self.gpus = gpus
        self.endpoint = f"http://{node}.sim.invalid:{port}"
        self.deployment = f"{self.model[1]}-{node.removeprefix('gpu-')}-{port}"


class _Node:
    """One simulated node: its snapshot as a dict, updated in place, and as bytes to send."""

    def __init__(self, index: int, gpus: int, rng: random.Random) -> None:
        self.index = index
        self.name = node_name(index, PER_RACK)
        self.rng = rng
        self.phase = rng.uniform(0, 2 * math.pi)
        half = max(1, gpus // 2)
        # Every fifth node serves llama-8b through Triton on its second engine.
        triton = index % 5 == 0
        second = (0 if triton else (index + 1)) % len(MODELS)
        self.engines = [
            _Engine(self.name, "vllm", 8000, index % len(MODELS), range(0, half)),
            _Engine(self.name, "triton" if triton else "vllm", 8001, second, range(half, gpus)),
        ]
        self.hot_gpu = 3 if index % 97 == 13 else None
        self.ecc_gpu = 5 if index % 211 == 7 else None
        self.snapshot = self._skeleton(gpus)
        self.response = b""
        self.streams: set[asyncio.Transport] = set()  # consoles following /v1/snapshot/stream

    def _skeleton(self, gpus: int) -> dict[str, Any]:
        owner = {g: e for e in self.engines for g in e.gpus}
        gpu_list = []
        for i in range(gpus):
            engine = owner.get(i)
            pid = 40_000 + 10 * self.index + (self.engines.index(engine) if engine else 0)
            gpu_list.append(
                {
                    "index": i,
                    "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.name}.scale/{i}')}",
                    "name": "NVIDIA H200 (SIMULATED)",
                    "memory_total_bytes": TOTAL_MEMORY,
                    "memory_used_bytes": int(0.9 * TOTAL_MEMORY) if engine else 4 * 2**20,
                    "power_limit_w": POWER_LIMIT_MW / 1000,
                    "mem_clock_mhz": MEM_MHZ,
                    "compute_capability": "9.0",
                    "mig_mode": False,
                    "ecc_uncorrected": 2 if i == self.ecc_gpu else 0,
                    "processes": [] if engine is None else [_process(pid, engine)],
                }
            )
        engines: list[dict[str, Any]] = [
            {
                "id": e.id,
                "kind": e.kind,
                "endpoint": e.endpoint,
                "version": TRITON_VERSION if e.kind == "triton" else VLLM_VERSION,
                "state": "ready",
                "pid": 40_000 + 10 * self.index + n,
                "deployment_ids": [e.deployment],
                "models": [{"name": e.served, "window_s": 60.0}],
            }
            for n, e in enumerate(self.engines)
        ]
        return {
            "node": {
                "name": self.name,
                "agent_version": f"{__version__}-sim",
                "hostname": f"{self.name}.simulated",
            },
            "host": {"cpu_count": 224, "mem_total_bytes": 2 * 2**40, "disks": []},
            "gpu_status": "ok",
            "driver_version": "580.95.05-sim",
            "cuda_driver_version": "13.0",
            "gpus": gpu_list,
            "engines": engines,
            "cycle": {"interval_s": 2.0},
        }

    def rebuild(self, now: float) -> None:
        """New values for everything that moves, then the bytes to send."""
        rnd = self.rng.random
        snap = self.snapshot
        load = 0.55 + 0.35 * math.sin(now / 600 + self.phase) + 0.05 * (rnd() - 0.5)
        snap["node"]["time"] = time.time()
        host = snap["host"]
        host["cpu_pct"] = round(20 + 30 * load + 5 * rnd(), 1)
        host["load1"] = round(40 + 60 * load, 2)
        host["mem_used_bytes"] = int((0.3 + 0.2 * load) * 2 * 2**40)
        for gpu in snap["gpus"]:
            busy = bool(gpu["processes"])
            util = min(100.0, 100 * load + 8 * rnd()) if busy else 0.0
            power = 75 + 600 * util / 100 * (0.6 + 0.4 * load) if busy else 75.0
            temp = 30 + 0.065 * power + rnd()
            reasons = [] if busy else ["idle"]
            if gpu["index"] == self.hot_gpu:
                temp = 88 + 3 * rnd()
                reasons.append("software thermal slowdown")
            gpu["utilization_pct"] = round(util)
            gpu["memory_utilization_pct"] = round(util * 0.7)
            gpu["temperature_c"] = round(temp)
            gpu["power_w"] = round(power, 1)
            gpu["sm_clock_mhz"] = 1980 if busy else 345
            gpu["clock_event_reasons"] = reasons
        for engine, spec in zip(snap["engines"], self.engines, strict=True):
            model = engine["models"][0]
            rate = (2 + 8 * load) * (0.9 + 0.2 * rnd())
            ttft = 0.05 + 0.25 * load * load
            itl = 0.008 + 0.02 * load
            model["requests_running"] = round(rate * 3)
            model["requests_waiting"] = round(max(0.0, 40 * (load - 0.8)))
            model["kv_cache_usage"] = round(0.2 + 0.6 * load, 3)
            model["request_rate"] = round(rate, 3)
            model["error_rate"] = 0.0 if rnd() > 0.05 else 0.002
            model["prompt_tokens_rate"] = round(rate * 1200, 1)
            model["generation_tokens_rate"] = round(rate * 250, 1)
            count = round(rate * 60)
            if spec.kind == "triton":  # Triton: windowed means only, as the real plugin gives
                model["latency"] = {
                    "ttft_s": _mean(ttft, count),
                    "itl_s": _mean(itl, count * 250),
                    "e2e_s": _mean(ttft + 250 * itl, count),
                }
            else:
                model["latency"] = {
                    "ttft_s": _percentiles(ttft, 0.6, count),
                    "itl_s": _percentiles(itl, 0.15, count * 250),
                    "e2e_s": _percentiles(ttft + 250 * itl, 0.5, count),
                }
            engine["probe_ms"] = round(3 + 4 * rnd(), 2)
        snap["cycle"]["wall_ms"] = round(20 + 10 * rnd(), 3)
        # pydantic's Rust serializer: five times faster than json.dumps for this.
        body = pydantic_core.to_json(snap)
        self.response = _response("200 OK", body)
        if self.streams:
            chunk = b"%x\r\n%s\n\r\n" % (len(body) + 1, body)
            for transport in list(self.streams):
                if transport.is_closing():
                    self.streams.discard(transport)
                else:
                    transport.write(chunk)


def _process(pid: int, engine: _Engine) -> dict[str, Any]:
    return {
        "pid": pid,
        "used_memory_bytes": int(0.9 * TOTAL_MEMORY),
        "engine_id": engine.id,
        "name": f"sim-{engine.kind}",
    }


def _mean(value: float, count: int) -> dict[str, Any]:
    return {"mean": round(value, 4), "count": count, "source": "mean"}


def _percentiles(median: float, spread: float, count: int) -> dict[str, Any]:
    return {
        "p50": round(median, 4),
        "p95": round(median * (1 + 2 * spread), 4),
        "p99": round(median * (1 + 3 * spread), 4),
        "mean": round(median * (1 + spread / 3), 4),
        "count": count,
        "source": "histogram",
    }


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
)


class _AgentProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive, parsed by httptools; every answer is prebuilt bytes."""

    def __init__(self, fleet: ScaleFleet, node: _Node) -> None:
        self.fleet = fleet
        self.node = node
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.auth = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.node.streams.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(BAD_REQUEST)
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.auth = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self.auth = value

    def on_message_complete(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(self._answer())
        if not self.parser.should_keep_alive():
            self.transport.close()

    def _answer(self) -> bytes:
        if self.parser.get_method() not in (b"GET", b"HEAD"):
            return NOT_ALLOWED
        path = self.url.split(b"?", 1)[0]
        if path == b"/healthz":
            return HEALTH
        if path not in (b"/v1/snapshot", b"/v1/snapshot/stream", b"/v1/whoami"):
            return NOT_FOUND
        if not hmac.compare_digest(self.auth, self.fleet.expected_auth):
            return UNAUTHORIZED
        if path == b"/v1/whoami":
            return WHOAMI
        if path == b"/v1/snapshot/stream" and self.transport is not None:
            # The agent's push route: every new snapshot as one NDJSON line, chunked.
            self.node.streams.add(self.transport)
            body = pydantic_core.to_json(self.node.snapshot)
            return STREAM_HEAD + b"%x\r\n%s\n\r\n" % (len(body) + 1, body)
        return self.node.response


class ScaleFleet:
    """A running scale fleet. `path` is its fleet.toml; `close()` stops it."""

    def __init__(self, path: Path, nodes: list[_Node], token: str, refresh_s: float) -> None:
        self.path = path
        self.nodes = nodes
        self.expected_auth = f"Bearer {token}".encode()
        self.refresh_s = refresh_s
        self._servers: list[asyncio.Server] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ScaleFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, socks: list[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for node in self.nodes:
            node.snapshot["cycle"]["interval_s"] = self.refresh_s
            node.rebuild(now)
        for node, sock in zip(self.nodes, socks, strict=True):
            server = await loop.create_server(
                lambda n=node: _AgentProtocol(self, n),  # type: ignore[misc]
                sock=sock,
                backlog=128,
            )
            self._servers.append(server)
        self._task = asyncio.create_task(self._refresh(), name="scale-refresh")

    async def _refresh(self) -> None:
        """Rebuild a slice of the snapshots every refresh_s / SLICES, smoothing the CPU.

        The slices keep to a fixed schedule: sleeping a whole step after each slice's work
        made every node's round 10-25 % longer than refresh_s at 1,000 nodes, so the bench
        measured fewer snapshots a second than it claimed.
        """
        step = self.refresh_s / SLICES
        start = time.monotonic()
        for part in itertools.count(1):  # forever; `part` counts the slices
            await asyncio.sleep(max(0.0, start + part * step - time.monotonic()))
            now = time.monotonic()
            for node in self.nodes[part % SLICES :: SLICES]:
                node.rebuild(now)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for server in self._servers:
            server.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers = []


async def serve_scale_fleet(
    out_dir: Path, nodes: int, gpus: int = 8, refresh_s: float = 1.0, *, token: str
) -> ScaleFleet:
    """Serve `nodes` lightweight SIMULATED agents on 127.0.0.1 and write their fleet.toml.

    Returns the running fleet (`.path` is the fleet file); stop it with `await .close()`.
    """
    if nodes < 1 or gpus < 2 or refresh_s <= 0:
        raise ValueError("want nodes >= 1, gpus >= 2 and refresh_s > 0")
    raise_open_files(3 * nodes + 256)  # a listening socket and a client or two per node
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    sim_nodes = [_Node(i, gpus, random.Random(rng.random())) for i in range(nodes)]
    socks = [listen_socket(AGENT_PORTS + i) for i in range(nodes)]
    fleet = ScaleFleet(out_dir / "fleet.toml", sim_nodes, token, refresh_s)
    try:
        _write(fleet.path, sim_nodes, socks, refresh_s)
        await fleet._serve(socks)
    except BaseException:
        await fleet.close()
        for sock in socks:
            sock.close()
        raise
    return fleet


def _write(path: Path, nodes: list[_Node], socks: list[socket.socket], refresh_s: float) -> None:
    out = FleetText(SCALE_HEADER.format(n=len(nodes)))
    name = f"scale-{len(nodes)} (SIMULATED)"
    out.add("[fleet]", {"name": name, "environment": "staging", "refresh_s": refresh_s})
    out.add("[agent]", {"discover": False, "operator_token_env": TOKEN_ENV})
    for node, sock in zip(nodes, socks, strict=True):
        agent = f"http://127.0.0.1:{port_of(sock)}"
        out.add("[[nodes]]", {"name": node.name, "agent": agent, "token_env": TOKEN_ENV})
    models = []
    for name, short, slo in MODELS:
        deployments: list[dict[str, object]] = [
            {
                "id": e.deployment,
                "node": node.name,
                "engine": e.kind,
                "endpoint": e.endpoint,
                "engine_model": ENSEMBLE if e.kind == "triton" else None,
                "weight": 100,
            }
            for node in nodes
            for e in node.engines
            if e.model[1] == short
        ]
        models.append((name, {"slo": slo}, deployments))
    model_tables(out, models)
    path.write_text(out.text(), encoding="utf-8")


SCALE_HEADER = """
SIMULATED scale fleet of {n} nodes, written by `python -m console.sim --scale {n}`.

Each node is a lightweight stand-in for an agent (GET /healthz and /v1/snapshot only),
serving generated snapshots from one process on 127.0.0.1; the engine endpoints below
(*.sim.invalid) do not exist. For the console's scale benchmark, not for a demo.
"""
