"""What the SIMULATED demo fleet runs where: its models, each node's engines and GPUs, the
standbys, the incidents placed on purpose, and the ports it prefers.

Nodes are gpu-a1, gpu-a2, gpu-b1, ... with 8 H200s each. llama-3.1-8b-instruct is served by
Triton (TensorRT-LLM) and by vLLM on different nodes; three more models run on vLLM, and
qwen2.5-32b-instruct's engines are started by the nodes' agents from launch profiles (as
`engineroom vllm start` does), so a rolling restart has engines it can restart. On
purpose: one GPU runs hot, one has an uncorrected ECC error (and an XID now and then), one
mistral deployment breaches its TTFT SLO periodically and one llama-70b deployment's queue
grows for a while.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from console.sim.fleetfile import node_name
from console.sim.load import Traffic

GPUS_PER_NODE = 8
ENGINE_PORTS, AGENT_PORTS = 18000, 19400  # preferred; each node gets 20 engine ports
GATEWAY_PORT = 19390
GATEWAY_RATE = 4.0  # SIMULATED client requests per second and model, through the gateway


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
            # Two H200s hold about 320k tokens of a 70B model's KV cache beside its weights;
            # a batch of 128 leaves the replicas headroom over the swing of their routed
            # traffic (with 64, the busiest replica queued at a swing's peak, at rest).
            vllm=Traffic(2.5, 2000, 350, 128, 320_000, 0.35, 0.028),
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
# The model whose vLLM deployments the agents start, each from a launch profile of its own
# (console.sim.standin_vllm, in a process of its own): what `engineroom rollout plan
# --restart --model qwen2.5-32b-instruct` restarts. It has no incident placed on it and no
# standby, so a rollout's verification has only the rollout to judge.
LAUNCHED = "qwen32b"
# Its failover plan (a rollout's drain and restore are planned failovers): one shift, not
# the default three (10, 50, 100 %), each verified over the default 10 s window, so a
# deployment's turn in a rolling restart takes about 50 s, not 90. Shorter windows hold so
# few simulated requests that one slow moment of a busy host breaches the ITL SLO.
LAUNCHED_FAILOVER: dict[str, object] = {"steps": [100]}
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
    def launched(self) -> bool:
        """Started by its node's agent from a launch profile, not run in the demo's process."""
        return self.kind == "vllm" and self.model.short == LAUNCHED

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


def ecc_gpu_of(nodes: int) -> tuple[int, int]:
    """(node, GPU) of the uncorrected ECC error: on the incident node where there is one."""
    return (1, 6) if nodes > 1 else (0, 5)


def stands_for(specs: list[EngineSpec], model: ModelInfo) -> float:
    """Simulated requests per client request of `model`: its deployments' rates together
    (what the model's users send) over the clients' own rate through the gateway."""
    return sum(s.traffic.rate for s in specs if s.model is model) / GATEWAY_RATE
