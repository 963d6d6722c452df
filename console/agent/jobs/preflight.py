"""Checks made before the agent starts an engine. Each names what it checked and says why
it failed, so an operator reads "port: 8001 is in use by pid 4242 (vllm)" instead of a
stack trace from the engine a minute later."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from console.agent.jobs.launch import Launch
from console.core.config.load import ArgValue, Profile
from console.core.wire import Gpu

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of each GPU it takes


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # port | gpus | model | binary | engine
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def failures(checks: list[Check]) -> str:
    """One line naming every failed check, for an error message."""
    return "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.ok)


def only_port(checks: list[Check]) -> bool:
    """Every check passed but the port's."""
    return any(not c.ok for c in checks) and all(c.ok or c.name == "port" for c in checks)


def port_check(port: int) -> Check:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (uvicorn too): a port whose last server just exited, with
        # connections in TIME_WAIT, is free; one that something listens on is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return Check("port", False, f"{port} is in use{_port_owner(port)}")
    return Check("port", True, f"{port} is free")


def _port_owner(port: int) -> str:
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return " (by a process this agent may not inspect)"
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(conn.pid)
                    return f" by pid {conn.pid} ({' '.join(proc.cmdline()[:3])[:80]})"
                return f" by pid {conn.pid}"
    return ""


def model_check(model: str) -> Check:
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return Check("model", True, f"{model} has config.json")
        return Check("model", False, f"{model} has no config.json")
    if model.startswith(("/", ".", "~")):
        return Check("model", False, f"{model} does not exist or is not a directory")
    return Check("model", True, f"{model!r} is not a local directory: a hub id, not checked")


def binary_check(argv: tuple[str, ...], env: dict[str, str]) -> Check:
    binary = argv[0]
    if os.sep in binary:
        if os.path.isfile(binary) and os.access(binary, os.X_OK):
            return Check("binary", True, f"{binary} is executable")
        return Check("binary", False, f"{binary} does not exist or is not executable")
    found = shutil.which(binary, path=env.get("PATH", os.environ.get("PATH")))
    if found is None:
        return Check("binary", False, f"{binary!r} is not on the agent's PATH")
    return Check("binary", True, f"{binary} is {found}")


def gpu_check(
    gpus: tuple[int, ...],
    profile: Profile,
    readings: list[Gpu],
    gpu_status: str,
    args: Mapping[str, ArgValue] | None = None,
    held: Mapping[int, str] | None = None,
) -> Check:
    """The GPUs are there, idle, and have the memory share the launch asks for (`args`:
    the flags as launched, overrides applied; the profile's when not given). `held`: the
    GPUs an open job or an engine this agent started holds, and by whom. One verdict per
    GPU: a held GPU is held, whatever NVML shows of it now (an engine that is loading has
    not touched its GPU yet, and NVML reads it idle: issue 28 listed "GPU 1 is held by
    engine vllm-18015" and "GPU 1 idle, 140.4 GiB free" side by side)."""
    if not gpus:
        return Check("gpus", True, "no GPUs requested")
    holders = held or {}
    if not readings and not holders:
        return Check("gpus", False, f"GPUs {list(gpus)} requested, but NVML reports: {gpu_status}")
    by_index = {g.index: g for g in readings}
    flags = profile.args if args is None else args
    share = flags.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    share = float(share) if isinstance(share, int | float) else DEFAULT_GPU_MEMORY_UTILIZATION
    problems, fine = [], []
    for index in gpus:
        if index in holders:
            problems.append(f"GPU {index} is held by {holders[index]}")
            continue
        if not readings:
            problems.append(f"GPU {index}: NVML reports {gpu_status}")
            continue
        gpu = by_index.get(index)
        if gpu is None:
            problems.append(f"GPU {index} does not exist (this node has {sorted(by_index)})")
            continue
        if gpu.processes is None:
            problems.append(f"GPU {index}: its processes could not be read")
        elif gpu.processes:
            owners = ", ".join(
                f"pid {p.pid}" + (f" ({p.engine_id or p.name})" if p.engine_id or p.name else "")
                for p in gpu.processes
            )
            problems.append(f"GPU {index} is in use by {owners}")
        total, used = gpu.memory_total_bytes, gpu.memory_used_bytes
        if total is None or used is None:
            problems.append(f"GPU {index}: its memory could not be read")
            continue
        need, free = share * total, total - used
        if free < need:
            problems.append(
                f"GPU {index} has {free / 2**30:.1f} GiB free, the launch needs "
                f"{need / 2**30:.1f} GiB (gpu_memory_utilization {share:g})"
            )
        else:
            fine.append(f"GPU {index} idle, {free / 2**30:.1f} GiB free")
    if problems:
        return Check("gpus", False, "; ".join(problems))
    return Check("gpus", True, "; ".join(fine))


def run(
    launch: Launch,
    profile: Profile,
    readings: list[Gpu],
    gpu_status: str,
    running_engine: str | None,
    held: Mapping[int, str] | None = None,
) -> list[Check]:
    """Every check, in the order an operator reads them; one check per thing checked
    (`held`: gpu_check's)."""
    checks = []
    if running_engine is not None:
        checks.append(Check("engine", False, running_engine))
    checks += [
        port_check(launch.port),
        gpu_check(launch.gpus, profile, readings, gpu_status, launch.args, held),
        model_check(profile.model),
        binary_check(launch.argv, {**os.environ, **launch.env}),
    ]
    return checks
