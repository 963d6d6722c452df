"""Stale-engine detection on a real GPU node (the device machine), in one run.

    python3 bench/trt_facts_on_gpu.py OUTDIR

TensorRT-LLM is not installed there either, so no engine is built. What this checks is
the part that needs a real GPU: NVML's driver, GPU name and compute capability, and the
drill's default version probe (python3 importing tensorrt_llm, tensorrt, torch), flowing
into the agent's manifest comparison. The agent's own code runs (NodeAgent, JobRunner,
DrillRunner), without HTTP.

1. An engine directory with a manifest "built" elsewhere: driver 575.57.08, CUDA 12.8,
   TensorRT-LLM 1.2.0, an H100 (compute capability 9.0).
2. The staleness check against this node: `trt_engines` as the snapshot carries it.
3. What-if: this node's own versions (nothing changes), and a driver upgrade.
Writes OUTDIR/trt-facts.json.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.agent.drills import manifest  # noqa: E402
from console.agent.jobs.runner import JobRunner  # noqa: E402
from console.agent.snapshot.node import NodeAgent  # noqa: E402
from console.core.config.load import parse_fleet  # noqa: E402

FLEET = """
[fleet]
name = "gpu-facts"
[agent]
state_dir = "{tmp}/state"
[[nodes]]
name = "gpu"
agent = "http://127.0.0.1:9"
[[models]]
name = "llama"
  [[models.deployments]]
  id = "llama-trt"
  node = "gpu"
  engine = "trtllm"
  endpoint = "http://127.0.0.1:9"
  engine_dir = "{tmp}/engines/llama-trt"
  [[models.deployments]]
  id = "llama-vllm"
  node = "gpu"
  engine = "vllm"
  endpoint = "http://127.0.0.1:9"
[drills.llama-bf16]
model = "llama"
deployment = "llama-trt"
checkpoint = "{tmp}/checkpoint"
engine_cache = "{tmp}/cache"
"""


async def run(out: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="trt-facts-"))
    checkpoint = tmp / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 4096)
    weights = manifest.WeightsHasher(tmp / "w.json").hash(checkpoint)
    engine = tmp / "engines" / "llama-trt"
    engine.mkdir(parents=True)
    (engine / "config.json").write_text('{"version": "1.2.0"}\n')
    (engine / "rank0.engine").write_bytes(b"\1" * 4096)
    built = {
        "schema": 1,
        "build_key": "bf16-recorded-elsewhere",
        "built": time.time() - 86400,
        "model": {"name": "llama", "checkpoint": str(checkpoint), "weights_sha256": weights},
        "pipeline": "engine",
        "precision": "bf16",
        "tp_size": 1,
        "shapes": {},
        "versions": {
            "tensorrt_llm": "1.2.0",
            "tensorrt": "10.13.3.9",
            "cuda": "12.8",
            "driver": "575.57.08",
        },
        "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"},
    }
    manifest.write_manifest(engine, built)
    fleet = parse_fleet(FLEET.format(tmp=tmp))
    agent = NodeAgent(fleet, "gpu")
    runner = JobRunner.open(agent)
    try:
        snap = await agent.cycle()
        started = time.perf_counter()
        engines = await runner.trt.refresh()
        refresh_s = time.perf_counter() - started
        probed = runner.trt.probed.get("llama-bf16", (0.0, {}))[1]
        own = {k: v for k, v in (await runner.trt.current_facts("llama-trt"))[0].items() if v}
        same = await runner.trt.what_if(own)
        upgrade = await runner.trt.what_if({"driver": "590.10"})
    finally:
        await runner.close()
        await agent.close()
    return {
        "node": {
            "gpu_status": snap.gpu_status,
            "driver_version": snap.driver_version,
            "cuda_driver_version": snap.cuda_driver_version,
            "gpus": [(g.index, g.name, g.compute_capability) for g in snap.gpus],
        },
        "default_probe_printed": probed,
        "manifest_built_with": {**built["versions"], **built["gpu"]},
        "trt_engines": [e.model_dump() for e in engines],
        "refresh_s (probe + compare)": round(refresh_s, 3),
        "what_if_this_node_as_it_is": same,
        "what_if_driver_590.10": upgrade,
    }


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    found = asyncio.run(run(out))
    text = json.dumps(found, indent=1, default=str)
    (out / "trt-facts.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
