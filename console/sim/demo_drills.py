"""The SIMULATED demo fleet's TensorRT-LLM engines, with provenance, and its rebuild drill.

The engine directories hold bytes, not engines; the drill runs the TensorRT-LLM TEST
DOUBLE (console/sim/trtllm_double.py), installed under the real tools' names, and its
candidate forwards to a simulated vLLM.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from console.agent.drills import manifest
from console.sim import nvml, trtllm_double
from console.sim.demo_layout import ENGINE_PORTS, EngineSpec
from console.sim.fleetfile import FleetText, listen_socket, node_name, port_of


def write_drills(
    out: FleetText, root: Path, specs: list[EngineSpec], http: list[socket.socket]
) -> None:
    """TensorRT-LLM engines with provenance, and a rebuild drill (all SIMULATED).

    Each Triton llama-8b deployment gets an engine directory: gpu-a1's was built for an
    older driver (REBUILD REQUIRED), gpu-c1's matches the node, and the last one has no
    manifest (unknown provenance). The drill for gpu-a1 runs the TensorRT-LLM test
    doubles of console/sim/trtllm_double.py; its candidate forwards to the simulated vLLM.
    """
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
                "versions": {k: facts[k] for k in ("tensorrt_llm", "tensorrt", "cuda", "driver")},
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
            str(trtllm_double.THIS_FILE),
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
