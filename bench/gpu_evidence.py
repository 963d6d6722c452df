"""Evidence and NVML cost on a real GPU machine (the device machine), in one run.

    python3 bench/gpu_evidence.py OUTDIR [--busy 0,1] [--seconds 40]

1. starts a bf16 matrix-product loop on the --busy GPUs (one process each) and leaves the
   others idle;
2. once the load runs, runs `engineroom agent --once --json` (the agentless path) and
   saves what it printed;
3. times the NVML sample per GPU (GpuSampler.sample, the agent's own code) against
   `nvidia-smi --query-gpu` in the same run, and the agent's whole cycle CPU time.
Writes agent-once.json, nvml-bench.json and a log into OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOAD = """
import sys, time, torch
end = time.time() + float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("load running", flush=True)
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def start_load(gpu: int, seconds: float) -> subprocess.Popen[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(seconds)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "load running" not in line:
        raise RuntimeError(f"matrix-product load on GPU {gpu} did not start: {line!r}")
    return proc


def time_nvml(samples: int) -> dict[str, object]:
    from console.agent.snapshot.gpu import GpuSampler

    sampler = GpuSampler()
    if not sampler.available:
        return {"gpu_status": sampler.status}
    from console.agent.snapshot.gpu import SLOW_EVERY

    n = len(sampler.sample())
    fast_us, slow_us, all_us = [], [], []
    for _ in range(samples):
        slow = sampler._samples % SLOW_EVERY == 0
        t0 = time.perf_counter()
        sampler.sample()
        per_gpu = (time.perf_counter() - t0) * 1e6 / n
        (slow_us if slow else fast_us).append(per_gpu)
        all_us.append(per_gpu)
    read_us = []
    for _ in range(samples):
        t0 = time.perf_counter()
        sampler.read()
        read_us.append((time.perf_counter() - t0) * 1e6 / n)
    sampler.close()
    smi_ms = []
    query = "--query-gpu=index,utilization.gpu,memory.used,temperature.gpu,power.draw"
    for _ in range(10):
        t0 = time.perf_counter()
        subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"], check=True, capture_output=True
        )
        smi_ms.append((time.perf_counter() - t0) * 1000)
    return {
        "gpus": n,
        "nvml_sample_per_gpu_us_median_every_cycle": round(statistics.median(all_us), 1),
        "nvml_sample_per_gpu_us_mean_every_cycle": round(statistics.mean(all_us), 1),
        "nvml_sample_per_gpu_us_median_fast_cycles": round(statistics.median(fast_us), 1),
        "nvml_sample_per_gpu_us_median_full_cycles": round(statistics.median(slow_us), 1),
        "full_sample_every_n_cycles": SLOW_EVERY,
        "with_wire_models_per_gpu_us_median": round(statistics.median(read_us), 1),
        "nvml_samples": samples,
        "nvidia_smi_query_ms_median": round(statistics.median(smi_ms), 1),
        "ratio_nvidia_smi_to_nvml_all_gpus": round(
            statistics.median(smi_ms) * 1000 / (statistics.median(all_us) * n), 1
        ),
    }


def time_cycles(cycles: int) -> dict[str, object]:
    import asyncio

    from console.agent.snapshot.node import NodeAgent
    from console.core.config.load import parse_fleet

    fleet = parse_fleet(
        '[fleet]\nname = "gpu"\n[agent]\ndiscover = true\n'
        '[[nodes]]\nname = "gpu"\nagent = "http://127.0.0.1:9410"\n'
    )

    async def run() -> list[tuple[float, float]]:
        agent = NodeAgent(fleet, "gpu")
        out = []
        for _ in range(cycles):
            snap = await agent.cycle()
            out.append((snap.cycle["cpu_ms"] or 0.0, snap.cycle["wall_ms"] or 0.0))
        await agent.close()
        return out

    results = asyncio.run(run())[1:]  # the first cycle scans processes and warms caches
    return {
        "cycles": len(results),
        "cycle_cpu_ms_median": round(statistics.median(c for c, _ in results), 3),
        "cycle_wall_ms_median": round(statistics.median(w for _, w in results), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--busy", default="0")
    parser.add_argument("--seconds", type=float, default=40)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    busy = [int(g) for g in args.busy.split(",") if g]
    loads = [start_load(g, args.seconds) for g in busy]
    time.sleep(3)  # let utilization and power climb
    command = [
        sys.executable,
        "-m",
        "console.cli",
        "agent",
        "--fleet",
        "fleet.toml",
        "--node",
        "local",
        "--once",
        "--json",
    ]
    once = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    (args.out / "agent-once.json").write_text(once.stdout)
    (args.out / "agent-once.stderr").write_text(once.stderr)
    bench = {
        "command": " ".join(["python3", "-m", "console.cli", *command[3:]]),
        "busy_gpus": busy,
        "load_pids": [p.pid for p in loads],
        "nvml": time_nvml(500),
        "cycle_under_load": time_cycles(30),
    }
    for p in loads:
        p.terminate()
        p.wait(timeout=30)
    bench["cycle_idle"] = time_cycles(30)
    (args.out / "nvml-bench.json").write_text(json.dumps(bench, indent=2))
    print(json.dumps(bench, indent=2))
    snap = json.loads(once.stdout) if once.stdout.strip() else {}
    for gpu in snap.get("gpus", []):
        print(
            f"gpu{gpu['index']} util={gpu['utilization_pct']} "
            f"mem={gpu['memory_used_bytes']} power={gpu['power_w']} "
            f"procs={[p['pid'] for p in gpu['processes'] or []]}"
        )
    return 0 if once.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
