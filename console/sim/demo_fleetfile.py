"""The SIMULATED demo fleet's fleet.toml: its gateway, agents, nodes, models with their
deployments, the launch profiles (the vLLM standbys', and one per deployment of the model
the agents start, demo_layout.LAUNCHED), and (through console.sim.demo_drills) its
TensorRT-LLM engines and rebuild drill.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

from console.sim.demo_drills import write_drills
from console.sim.demo_layout import (
    ENGINE_PORTS,
    LAUNCHED,
    LAUNCHED_FAILOVER,
    MODELS,
    STANDBYS,
    EngineSpec,
    ModelInfo,
    stands_for,
)
from console.sim.fleetfile import (
    TOKEN_ENV,
    VIEWER_TOKEN_ENV,
    FleetText,
    listen_socket,
    model_tables,
    node_name,
    port_of,
)
from console.sim.load import STANDS_FOR_ENV
from console.sim.standin_vllm import MODEL_ENV
from console.sim.triton_engine import ENSEMBLE

DEMO_HEADER = """
SIMULATED fleet, written by `python -m console.sim` (behind `engineroom demo`).

The agents are real engineroom agents; the GPUs (NVML), the engines (vLLM-like and
Triton/TensorRT-LLM-like servers) and their traffic are SIMULATED, all in one process on
127.0.0.1. This file is valid only while that process runs. The operator token for every node
(and the gateway's admin token) is in the environment variable ENGINEROOM_DEMO_TOKEN; the
viewer token the web view reads with, in ENGINEROOM_DEMO_VIEWER_TOKEN.
"""


def write_fleet_file(
    path: Path,
    specs: list[EngineSpec],
    http: list[socket.socket],
    metrics: list[socket.socket | None],
    agent_socks: list[socket.socket],
    gateway_sock: socket.socket,
    window_s: float = 60.0,
    verify_s: float | None = None,
) -> None:
    """The demo's fleet.toml at `path`, naming the sockets the fleet listens on; the
    agents' `window_s` and, where given, every model's failover `verify_s`."""
    root = path.parent
    standbys = demo_standbys(len(agent_socks))
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
            "state_dir": str(root / "gateway"),
        },
    )
    out.add(
        "[agent]",
        {
            "scrape_interval_s": 2.0,
            "window_s": window_s,
            "probe_timeout_s": 2.0,
            "discover": False,
            "operator_token_env": TOKEN_ENV,
            "viewer_token_env": VIEWER_TOKEN_ENV,
            "state_dir": str(root / "state"),
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
                    "metrics_endpoint": (f"http://127.0.0.1:{port_of(msock)}" if msock else None),
                    "engine_model": ENSEMBLE if spec.kind == "triton" else None,
                    "weight": 100,
                    "engine_dir": (
                        str(root / "engines" / spec.deployment_id)
                        if spec.kind == "triton"
                        else None
                    ),
                    # Its agent starts it from this profile, and restarts it from it.
                    "profile": spec.deployment_id if spec.launched else None,
                }
            )
        for standby in standbys:
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
        failover = dict(LAUNCHED_FAILOVER) if model.short == LAUNCHED else {}
        if verify_s is not None:
            failover["verify_s"] = verify_s
        models.append((model.name, {"slo": model.slo, "failover": failover or None}, deployments))
    model_tables(out, models)
    _write_profiles(out, root, specs, http, standbys)
    write_drills(out, root, specs, http)
    path.write_text(out.text(), encoding="utf-8")


def demo_standbys(nodes: int) -> list[dict[str, Any]]:
    """The demo's vLLM standbys: a profile and a weight-0 deployment each (ports chosen
    once, when the fleet file is written)."""
    standbys: list[dict[str, Any]] = []
    for node, short, gpu in STANDBYS:
        if node >= nodes:
            continue
        with listen_socket(ENGINE_PORTS + 20 * node + 15) as sock:
            port = port_of(sock)  # free now; the agent's preflight checks it again
        standbys.append(
            {
                "short": short,
                "node": node_name(node, 2),
                "gpu": gpu,
                "port": port,
                "profile": f"{short}-standby-{node_name(node, 2).removeprefix('gpu-')}",
            }
        )
    return standbys


def _write_profiles(
    out: FleetText,
    root: Path,
    specs: list[EngineSpec],
    http: list[socket.socket],
    standbys: list[dict[str, Any]],
) -> None:
    """Launch profiles: the standbys', on GPUs the layout leaves idle, for "Start vLLM" in
    the demo; and one per deployment of the model the agents start (its GPUs and port).

    They launch console.sim.standin_vllm (SIMULATED): vLLM's log lines, then the
    simulated engine, whose traffic is what the gateway sends it (STANDS_FOR_ENV: how
    many users a client request stands for; MODEL_ENV: whose traffic shape, for the
    started model's). The model directories hold only a config.json, for the preflight.
    """
    wanted: list[tuple[str, ModelInfo, str, int, list[int], dict[str, str]]] = [
        (s["profile"], MODELS[s["short"]], s["node"], s["port"], [s["gpu"]], {}) for s in standbys
    ]
    wanted += [
        (spec.deployment_id, spec.model, node_name(spec.node, 2), port_of(sock),
         list(spec.gpus), {MODEL_ENV: spec.model.short})
        for spec, sock in zip(specs, http, strict=True)
        if spec.launched
    ]  # fmt: skip
    for name, model, node, port, gpus, env in wanted:
        directory = root / "models" / model.short
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text('{"SIMULATED": true}\n')
        out.add(
            f"[profiles.{name}]",
            {
                "engine": "vllm",
                "node": node,
                "model": str(directory),
                "served_model_name": model.name,
                "port": port,
                "gpus": gpus,
                "tensor_parallel_size": len(gpus),
                "command": [sys.executable, "-m", "console.sim.standin_vllm"],
                "args": {"host": "127.0.0.1", "max_model_len": 8192, "dtype": "bfloat16"},
                "overridable": ["port"],
                "allowed_args": ["max_num_seqs", "gpu_memory_utilization"],
                "stop_grace_s": 10.0,
                "env": {STANDS_FOR_ENV: f"{stands_for(specs, model):.4g}", **env},
            },
        )
