"""What the alerting-rule tests share (tests/test_rules.py, tests/test_rules_diagnoses.py):
node "a" with model "tiny" on three deployments (a vLLM, a standby vLLM, a Triton), the
engines a snapshot of that node shows, and `engineroom rules` run on a fleet file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Protocol

from console.core.wire import Engine, Gpu, Host, ModelStats, NodeInfo, Snapshot, TrtEngine
from tests.conftest import run_cli

NODE_A = {"name": "a", "agent": "http://127.0.0.1:1"}
# Model "tiny"'s deployments on node "a": the engines vllm(), standby() and triton() serve them.
TINY_DEPLOYMENTS = [
    {"id": "tiny-vllm", "node": "a", "engine": "vllm", "endpoint": "http://127.0.0.1:8001"},
    {
        "id": "tiny-standby",
        "node": "a",
        "engine": "vllm",
        "endpoint": "http://127.0.0.1:8002",
        "weight": 0,
    },
    {
        "id": "tiny-trt",
        "node": "a",
        "engine": "triton",
        "endpoint": "http://127.0.0.1:8000",
        "engine_model": "ens.v1",
    },
]


def _serving(kind: str, port: int, version: str, deployment: str, model: str, state: str,
             stats: dict[str, object]) -> Engine:  # fmt: skip
    return Engine(
        id=f"{kind}-{port}",
        kind=kind,  # type: ignore[arg-type]
        endpoint=f"http://127.0.0.1:{port}",
        version=version,
        state=state,  # type: ignore[arg-type]
        deployment_ids=[deployment],
        models=[ModelStats(name=model, **stats)],  # type: ignore[arg-type]
    )


def vllm(state: str = "ready", **stats: object) -> Engine:
    """tiny-vllm's engine, with `stats` for model tiny."""
    return _serving("vllm", 8001, "0.32.0", "tiny-vllm", "tiny", state, stats)


def standby(state: str = "down") -> Engine:
    """tiny-standby's engine: down, nothing known of it."""
    return Engine(
        id="vllm-8002",
        kind="vllm",
        endpoint="http://127.0.0.1:8002",
        state=state,  # type: ignore[arg-type]
        deployment_ids=["tiny-standby"],
    )


def triton(state: str = "ready", **stats: object) -> Engine:
    """tiny-trt's engine, with `stats` for its ensemble ens.v1."""
    return _serving("triton", 8000, "2.51.0", "tiny-trt", "ens.v1", state, stats)


class NodeCase(Protocol):
    gpus: list[Gpu]
    engines: list[Engine]
    trt: list[TrtEngine]


def snapshot(case: NodeCase) -> Snapshot:
    """Node "a"'s snapshot with the case's GPUs, engines and TensorRT-LLM engines."""
    return Snapshot(
        node=NodeInfo(name="a", agent_version="0", time=0.0),
        host=Host(),
        gpu_status="ok",
        gpus=case.gpus,
        engines=case.engines,
        trt_engines=case.trt,
    )


def rules_written(workdir: Path, fleet_text: str) -> tuple[Path, subprocess.CompletedProcess]:
    """`engineroom rules --fleet F --out FILE`, the real command, on `fleet_text`: the
    file it wrote, and what it said."""
    (workdir / "fleet.toml").write_text(fleet_text)
    out = workdir / "rules.yml"
    result = run_cli("rules", "--fleet", str(workdir / "fleet.toml"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, result
