"""A SIMULATED vLLM server process, for the demo fleet's launch profiles only.

    python -m console.sim.standin_vllm --model DIR --served-model-name NAME --port P [...]

`engineroom demo` has no vLLM, so its profiles launch this instead: it takes vLLM's
command line (unknown flags are ignored), prints the log lines vLLM prints at each
cold-start phase, about a second apart, then serves the simulated vLLM engine of the demo
(console.sim.vllm_engine), whose traffic is what the gateway routes to it: each demo client
request it gets stands for $ENGINEROOM_SIM_STANDS_FOR users' requests (console.sim.load,
routed traffic), none before the gateway sends it any. Its traffic's shape (batch limit,
prefill, inter-token latency) is the demo model's named by $ENGINEROOM_SIM_MODEL (a short
name of console.sim.demo_layout.MODELS), else a standby's. It names its process sim-vllm,
as the demo's other engine stand-ins are named, so a GPU's process list says what it is.
SIGTERM ends it the way vLLM ends. It is never used by a test of a real path: those run
real vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import sys
import time

from console.sim.demo_layout import MODELS
from console.sim.load import STANDS_FOR_ENV, TICK_S, Routed, Traffic, Workload
from console.sim.vllm_engine import VllmEngine

MODEL_ENV = "ENGINEROOM_SIM_MODEL"  # the demo model whose traffic shape it takes
PROCESS_NAME = b"sim-vllm"

# (seconds after start, line): what vLLM 0.32 logs on its way to ready (SIMULATED). Ready
# in 3.3 s: the demo waits for its launched engines before it opens (it took 6.5 s, which
# every start of the demo, and each test of it, waited out).
PHASES = (
    (0.5, "INFO [core.py] Initializing a V1 LLM engine (v0.32.0 SIMULATED) with config: ..."),
    (1.5, "INFO [default_loader.py] Loading weights took 0.98 seconds"),
    (2.0, "INFO [kv_cache_utils.py] GPU KV cache size: 412,000 tokens"),
    (3.0, "INFO [gpu_model_runner.py] Graph capturing finished in 1 secs, took 0.35 GiB"),
    (3.3, "INFO [entry.py] Starting vLLM server on http://{host}:{port}"),
)
# vLLM's default batch limit (max_num_seqs 256): a standby takes a failed-over share.
TRAFFIC = Traffic(1.5, 900, 200, 256, 412_000, 0.08, 0.012)


def traffic_of(short: str | None) -> Traffic:
    """The shape of a stand-in's traffic: demo model `short`'s vLLM traffic, else a
    standby's (TRAFFIC)."""
    model = MODELS.get(short or "")
    return model.vllm if model is not None else TRAFFIC


def name_process() -> None:
    """Linux: this process's name (what NVML's process list and `ps` show) becomes sim-vllm."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(15, PROCESS_NAME, 0, 0, 0)  # PR_SET_NAME


def say(line: str) -> None:
    print(f"(APIServer pid={os.getpid()}) {line}", flush=True)


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    started = time.monotonic()
    say(f"INFO [api_utils.py] version 0.32.0 (SIMULATED)  model {args.model}")
    for at, line in PHASES:
        remaining = max(0.0, at - (time.monotonic() - started))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), remaining)
        if stop.is_set():
            say("INFO [launcher.py] [shutdown] API server: shutdown triggered during load")
            return
        say(line.format(host=args.host, port=args.port))
    try:
        stands_for = max(0.0, float(os.environ.get(STANDS_FOR_ENV, "1")))
    except ValueError:
        stands_for = 1.0
    # No traffic until the gateway routes some here (prior 0).
    routed = Routed(stands_for, prior=0.0)
    traffic = traffic_of(os.environ.get(MODEL_ENV))
    workload = Workload(traffic, seed=args.port, start=time.monotonic(), routed=routed)
    engine = VllmEngine(workload, args.served_model_name, gpus=args.tensor_parallel_size)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))  # exactly this port, as vLLM: taken means exit
    sock.listen(128)
    sock.setblocking(False)
    await engine.start(sock)
    say("INFO:     Application startup complete.")

    async def tick() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            workload.tick(time.monotonic())

    ticker = asyncio.create_task(tick())
    await stop.wait()
    say("INFO [launcher.py] [shutdown] API server: shutdown triggered")
    ticker.cancel()
    await engine.stop()
    say("INFO:     Application shutdown complete.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="standin_vllm")
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args, _ = parser.parse_known_args(argv)
    name_process()
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
