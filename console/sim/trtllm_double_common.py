"""TEST DOUBLE of TensorRT-LLM's command-line tools: what its sub-commands share.

The TensorRT-LLM version it reports, its log lines, the failures and hangs injected on
demand (TRTLLM_DOUBLE_FAIL, TRTLLM_DOUBLE_HANG), deterministic bytes for the files that
stand for weights and engines, and reading and writing their JSON configs. The whole
double, and what it does and does not imitate: console/sim/trtllm_double.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_VERSION = "1.2.0"

# What each sub-command prints before an injected failure, and the error it then reports.
FAILURES = {
    "convert": "CUDA runtime error in cudaMalloc: out of memory",
    "quantize": "CUDA runtime error in cudaMalloc: out of memory",
    "build": "CUDA runtime error in cudaMalloc: out of memory",
    "serve": "Failed to deserialize cuda engine: engine plan built for a different GPU",
    "versions": "CUDA initialization failure with error: 35 (driver version is insufficient)",
}


def version() -> str:
    return os.environ.get("TRTLLM_DOUBLE_VERSION") or DEFAULT_VERSION


def say(line: str) -> None:
    print(line, flush=True)


def elapsed(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(max(seconds, 1.0)))


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        say(f"[TensorRT-LLM][WARNING] {name}={raw!r} is not a number; using {default}")
        return default


def _selected(env: str, sub: str) -> bool:
    return sub in {s.strip() for s in os.environ.get(env, "").split(",")}


def inject_faults(sub: str, banner: bool = True) -> None:
    """Exit 1 (TRTLLM_DOUBLE_FAIL) or hang for good (TRTLLM_DOUBLE_HANG) when asked to.

    `banner`: print the version line first (the caller has not printed it yet).
    """
    if banner and (_selected("TRTLLM_DOUBLE_FAIL", sub) or _selected("TRTLLM_DOUBLE_HANG", sub)):
        say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
    if _selected("TRTLLM_DOUBLE_FAIL", sub):
        say("[TRT] [I] [MemUsageChange] Init CUDA: CPU +2, GPU +0, now: CPU 512, GPU 1024 (MiB)")
        say(f"[TensorRT-LLM][ERROR] {FAILURES[sub]} (TEST DOUBLE: TRTLLM_DOUBLE_FAIL={sub})")
        sys.exit(1)
    if _selected("TRTLLM_DOUBLE_HANG", sub):
        say(f"[TensorRT-LLM] {sub}: waiting on the GPU (TEST DOUBLE: hanging)")
        # A child in the same group (as MPI workers are), deaf to SIGTERM like its parent
        # (the ignore is inherited): only a SIGKILL of the whole group leaves no orphan.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        pids_file = os.environ.get("TRTLLM_DOUBLE_CHILD_PIDS")
        if pids_file:
            with open(pids_file, "a") as out:
                out.write(f"{child.pid}\n")
        while True:
            time.sleep(3600)


def fill(seed: str, size: int) -> bytes:
    """`size` bytes that depend only on `seed`."""
    return hashlib.shake_256(seed.encode()).digest(size)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object at `path`, or an error line and exit 1."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        say(f"[TensorRT-LLM][ERROR] {what}: {path} not found")
        sys.exit(1)
    except (OSError, ValueError) as exc:
        say(f"[TensorRT-LLM][ERROR] {what}: cannot read {path}: {exc}")
        sys.exit(1)
    if not isinstance(data, dict):
        say(f"[TensorRT-LLM][ERROR] {what}: {path} is not a JSON object")
        sys.exit(1)
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=4) + "\n")
