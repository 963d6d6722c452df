"""The one definition of engineroom's diagnoses: each class's name, wording, thresholds,
what rules it out and its moves, in order.

A diagnosis names a problem (an alert names a figure): "engine wedged" where the alerts
say a queue grows and a p95 is over its SLO. The evaluation (console/collect/diagnose/diagnoser.py)
reads only this module for what a class is; `engineroom diagnose`, `check --json` and the
console's Diagnoses screen show what it found; `engineroom rules` writes the classes PromQL
can tell as Prometheus alerting rules (console/collect/promrules/diagnoses.py). docs/diagnoses.md
gives each class with its signals per engine; tests/test_diagnoses.py holds the two together.

Thresholds have defaults here and may be set in fleet.toml, `[diagnoses]` for the fleet
and `[models.diagnoses]` for one model (console.core.config.model.DiagnosisLimits).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from console.core.config.model import Fleet

Severity = Literal["critical", "warning"]
Subject = Literal["engine", "deployment", "gpu", "job", "model"]
# The moves the console has, in the words a diagnosis lists them.
Move = Literal["failover", "quarantine", "restart", "stop", "standby", "start", "drill", "escalate"]
MOVE_TEXT: dict[Move, str] = {
    "failover": "fail the model over to a healthy deployment",
    "quarantine": "quarantine the deployment (weight 0 at the gateway)",
    "restart": "restart the engine",
    "stop": "stop the engine",
    "standby": "start a standby deployment",
    "start": "start the profile again once its cause is fixed",
    "drill": "run the rebuild drill",
    "escalate": "escalate as hardware",
}

DEFAULTS: dict[str, float] = {
    # No token generated for this long while requests are in: about two scrapes of the
    # agent's default 2 s, and a held prefill still passes (a long prompt's first token
    # comes in well under this on any GPU engine).
    "wedged_after_s": 6.0,
    # Requests queued in Triton and none finished for this long. Longer than a wedge's: a
    # request finishes only at its last token, and a long generation is no stall.
    "triton_stall_after_s": 20.0,
    # This many exits of an engine's process that no one asked for, within the window: a
    # crash loop (an outside supervisor, systemd or Kubernetes, starting it again).
    "crash_loop_exits": 3.0,
    "crash_loop_window_s": 600.0,
    "kv_pressure_usage": 0.9,  # with preemptions, or requests waiting for capacity
    # Preemptions a second over the window that are a storm whatever the KV gauge read: an
    # engine preempts only when its KV cache has no block left, and vLLM's gauge is read at
    # a scrape, which a busy API server answers between batches (it read 0 % on a vLLM
    # preempting 3.8 requests a second).
    "kv_preemption_storm_rate": 0.5,
    "saturated_gap_times": 3.0,  # the gateway's TTFT p95 over the engine's
    "saturated_cpu_pct": 90.0,  # the API server's process, of one core
    "imbalance_times": 2.0,  # a deployment's p95 over its siblings' median
    "error_burst_rate": 0.05,  # failed / finished over the window
}


def limit(fleet: Fleet, model: str | None, key: str) -> float:
    """A threshold for `model`: its own [models.diagnoses], the fleet's, the default."""
    for m in fleet.models:
        if m.name == model and (value := getattr(m.diagnoses, key)) is not None:
            return float(value)
    value = getattr(fleet.diagnoses, key)
    return float(value) if value is not None else DEFAULTS[key]


@dataclass(frozen=True, slots=True)
class DiagnosisDef:
    name: str  # the stable key (check --json, docs/diagnoses.md)
    title: str
    severity: Severity
    subject: Subject
    summary: str  # what it is, one line
    rules_out: str  # what would say it is not this
    moves: tuple[Move, ...]
    # How long the condition must hold, while watched, before it is raised (one already
    # there at the first look is raised at once, as an alert is: active at start).
    hold_s: float = 0.0
    # False for a class `engineroom rules` cannot write as a Prometheus rule, with why in
    # `note` (console/collect/promrules/diagnoses.py writes the others).
    in_rules: bool = True
    note: str = ""


ENGINE_WEDGED = DiagnosisDef(
    "engine_wedged",
    "engine wedged",
    "critical",
    "engine",
    "requests are in but no token was generated for wedged_after_s; the engine still answers",
    "generated tokens rising again; no request running or waiting",
    ("failover", "restart"),
)
TRITON_STALL = DiagnosisDef(
    "triton_stall",
    "Triton stall",
    "critical",
    "engine",
    "requests wait in Triton's queue and none finished for triton_stall_after_s; Triton "
    "still answers",
    "the success count rising again; nothing pending",
    ("failover", "restart"),
)
CRASH_LOOP = DiagnosisDef(
    "crash_loop",
    "crash loop",
    "critical",
    "engine",
    "the engine's process exited with no stop asked and is not back, or exited "
    "crash_loop_exits times within crash_loop_window_s",
    "its process up and no exit it was not asked for within crash_loop_window_s",
    ("failover", "stop"),
    in_rules=False,
    note="the exits no one asked for are the agent's watch of the engine's process (its "
    "snapshot), not a series in /metrics",
)
KV_PRESSURE = DiagnosisDef(
    "kv_pressure",
    "KV-cache pressure",
    "warning",
    "engine",
    "KV cache at or over kv_pressure_usage with requests preempted or waiting for "
    "capacity, or kv_preemption_storm_rate preemptions a second or more whatever it reads",
    "no preemption and nothing waiting for capacity over the window",
    ("standby", "failover"),
)
API_SERVER_SATURATED = DiagnosisDef(
    "api_server_saturated",
    "API server saturated",
    "warning",
    "deployment",
    "clients wait saturated_gap_times longer for a first token than the engine takes, with "
    "the API server's process near a core",
    "the gateway's TTFT p95 near the engine's; the API server's CPU well under a core",
    ("standby", "failover"),
    hold_s=30.0,
    in_rules=False,
    note="it compares the gateway's exact TTFT p95 (its admin snapshot) with the engine's; "
    "Prometheus has only the gateway's histogram buckets, whose interpolated p95 would "
    "raise it where the console does not",
)
START_FAILED = DiagnosisDef(
    "start_failed",
    "start failed",
    "warning",
    "job",
    "a vllm.start or engine.restart job failed; the cause is read from its error and log",
    "a later start of the same engine that succeeded",
    ("start", "standby"),
    in_rules=False,
    note="a failed job and its log are in the agent's jobs API, not in /metrics",
)
SLOW_COLD_START = DiagnosisDef(
    "slow_cold_start",
    "slow cold start",
    "warning",
    "job",
    "a start took longer than its profile's cold_start_budget_s; names the slowest phase",
    "a later start within the budget",
    ("drill",),
    in_rules=False,
    note="a start's phases and its profile's budget are in the agent's jobs, not in /metrics",
)
REPLICA_IMBALANCE = DiagnosisDef(
    "replica_imbalance",
    "replica imbalance",
    "warning",
    "deployment",
    "one deployment's TTFT or ITL p95 at imbalance_times its siblings' median or more",
    "the deployment's p95 back near its siblings'",
    ("quarantine", "restart"),
    hold_s=60.0,
    in_rules=False,
    note="it takes the median of the other deployments' p95s, each left out of its own; "
    "PromQL's quantile() takes every series of a group",
)
ERROR_BURST = DiagnosisDef(
    "error_burst",
    "error burst",
    "critical",
    "deployment",
    "failed / finished requests over error_burst_rate in the window",
    "the error rate back under error_burst_rate",
    ("failover", "quarantine", "restart"),
    hold_s=30.0,
)
GPU_FAULT = DiagnosisDef(
    "gpu_fault",
    "GPU fault",
    "critical",
    "gpu",
    "an XID the driver reported (classified), uncorrected ECC errors, failed row remapping, "
    "a GPU NVML says is lost, or fewer GPUs listed than the node had",
    "none: a fault the driver reported stays until the GPU is reset or replaced",
    ("failover", "escalate"),
)
THROTTLED_GPU = DiagnosisDef(
    "throttled_gpu",
    "throttled GPU",
    "warning",
    "gpu",
    "a GPU an engine runs on is slowed (thermal, power cap, hardware slowdown or power "
    "brake) while the engine's ITL p95 is over its model's SLO",
    "no slowdown reason on the GPU, or the ITL p95 back under the SLO",
    ("failover", "escalate"),
    hold_s=60.0,
    in_rules=False,
    note="which engine runs on which GPU is the agent's (the GPU's processes), not a label "
    "of the GPU's series",
)
# The clock-event reasons that slow a GPU down (console.core.metrics.readings' words), the most
# telling first (it names the cause); "idle", "applications clocks setting", "sync boost"
# and "display clock setting" do not.
SLOWDOWNS = (
    "hardware power brake",
    "hardware thermal slowdown",
    "hardware slowdown",
    "software thermal slowdown",
    "software power cap",
)
STALE_TRT = DiagnosisDef(
    "stale_trt_engine",
    "stale TensorRT-LLM engine",
    "warning",
    "deployment",
    "the TensorRT-LLM engine no longer matches its node's driver, CUDA, TensorRT-LLM or GPU",
    "a build key that matches the node again (a drill's promoted build)",
    ("standby", "failover", "drill"),
)

ALL: tuple[DiagnosisDef, ...] = (
    ENGINE_WEDGED,
    TRITON_STALL,
    CRASH_LOOP,
    KV_PRESSURE,
    API_SERVER_SATURATED,
    START_FAILED,
    SLOW_COLD_START,
    REPLICA_IMBALANCE,
    ERROR_BURST,
    GPU_FAULT,
    THROTTLED_GPU,
    STALE_TRT,
)
BY_NAME = {d.name: d for d in ALL}

# -- what a look found (console/collect/diagnose/diagnoser.py finds them) ------------------------

State = Literal["active", "verifying", "resolved", "still there"]


@dataclass(frozen=True, slots=True)
class Evidence:
    figure: str
    value: str
    at: str  # where it was measured: "engine vllm-8000 on node-a", "gateway", "job 3f2a"
    age_s: float | None  # how old the reading is; None: unknown

    def as_dict(self) -> dict[str, Any]:
        age = None if self.age_s is None else round(self.age_s, 1)
        return {"figure": self.figure, "value": self.value, "at": self.at, "age_s": age}


@dataclass(slots=True)
class Diagnosis:
    kind: DiagnosisDef
    subject: str  # "node-a/gpu1", "llama-70b/llama-trt", "node-a/vllm-8000", "job 3f2a"
    node: str | None
    evidence: list[Evidence]
    model: str | None = None
    deployment: str | None = None
    engine: str | None = None
    cause: str | None = None  # start failed: the named cause; GPU fault: the XID's class
    profile: str | None = None  # start failed, slow cold start: the launch profile started
    state: State = "active"
    since: float = 0.0  # when it was first seen (wall clock)
    detail: str = ""  # verifying / resolved after N s / still there: ...

    @property
    def moves(self) -> list[Move]:
        """Its class's moves, in order (one definition: console/core/diagnosis.py)."""
        return list(self.kind.moves)

    @property
    def key(self) -> tuple[str, str]:
        return self.kind.name, self.subject

    def headline(self) -> str:
        cause = f" ({self.cause})" if self.cause else ""
        state = "" if self.state == "active" else f" [{self.detail or self.state}]"
        return f"{self.kind.title}{cause}: {self.subject}{state}"

    def as_dict(self) -> dict[str, Any]:
        """check --json's and diagnose --json's shape (docs/diagnoses.md)."""
        return {
            "name": self.kind.name,
            "title": self.kind.title,
            "severity": self.kind.severity,
            "subject_kind": self.kind.subject,
            "subject": self.subject,
            "node": self.node,
            "model": self.model,
            "deployment": self.deployment,
            "engine": self.engine,
            "cause": self.cause,
            "profile": self.profile,
            "state": self.state,
            "detail": self.detail or None,
            "since": round(self.since, 3),
            "evidence": [e.as_dict() for e in self.evidence],
            "rules_out": self.kind.rules_out,
            "moves": [{"move": m, "text": MOVE_TEXT[m]} for m in self.moves],
        }


@dataclass(frozen=True, slots=True)
class CannotTell:
    name: str
    subject: str
    needs: str

    def line(self) -> str:
        return f"{BY_NAME[self.name].title}: {self.subject}: cannot tell, needs {self.needs}"


# -- XIDs ---------------------------------------------------------------------------------
# Recorded from NVIDIA's XID catalogue (https://docs.nvidia.com/deploy/xid-errors/, the
# "Xid messages" table and its "recommended actions"), as gpud and NVSentinel also map them.
XID_CLASSES: dict[int, tuple[str, str]] = {
    13: ("application", "graphics engine exception: usually the application; restart it"),
    31: ("application", "GPU memory page fault: usually the application; restart it"),
    43: ("application", "GPU stopped processing: the application's channel was reset"),
    45: ("application", "preemptive cleanup after an earlier error"),
    48: ("memory", "double-bit ECC error: drain, then reset the GPU"),
    63: ("memory", "ECC page retirement or row remapping recorded: reset the GPU when drained"),
    64: ("memory", "ECC page retirement or row remapping failed: the GPU needs service"),
    74: ("interconnect", "NVLink error: check the links, reset the GPU"),
    79: ("hardware", "GPU fell off the bus: the node needs a reset or the GPU service"),
    92: ("memory", "high single-bit ECC error rate"),
    94: ("memory", "contained ECC error: restart the application"),
    95: ("memory", "uncontained ECC error: drain and reset the GPU"),
    119: ("hardware", "GSP RPC timeout: reset the GPU"),
    120: ("hardware", "GSP error: reset the GPU"),
}


def xid_class(xid: int) -> tuple[str, str]:
    """(kind, what to do) for an XID; one the table lacks is "unclassified", never ignored."""
    return XID_CLASSES.get(xid, ("unclassified", "not in the recorded table: see NVIDIA's"))


ESCALATE_COMMANDS = ("nvidia-smi -q", "sudo nvidia-bug-report.sh")


def escalation_commands(fleet: Fleet, node: str) -> list[str]:
    """The commands that gather what the GPU's vendor asks for, as typed here: over the
    node's ssh where fleet.toml gives one (its target quoted for a shell), else as typed on
    the node. The console copies them and `engineroom diagnose` prints them; nothing runs."""
    found = next((n for n in fleet.nodes if n.name == node), None)
    if found is None or not found.ssh:
        return list(ESCALATE_COMMANDS)
    port = f"-p {found.ssh_port} " if found.ssh_port else ""
    return [f"ssh -t {port}{shlex.quote(found.ssh)} {c}" for c in ESCALATE_COMMANDS]


# -- why a start failed ---------------------------------------------------------------------
# Read from a failed job's error and log tail, first match wins. The patterns are vLLM's
# own words (vllm/v1/core/kv_cache_utils.py, the CUDA runtime, uvicorn, transformers).
START_CAUSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "KV cache cannot hold max_model_len",
        re.compile(r"max seq len|larger than the available KV cache|KV cache is needed", re.I),
    ),
    ("out of memory", re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY", re.I)),
    ("port in use", re.compile(r"address already in use|Errno 98|port: \d+ is in use", re.I)),
    (
        "model path missing",
        re.compile(
            r"does not exist or is not a directory|not a valid model identifier|"
            r"Repo id must be|Invalid repository ID",
            re.I,
        ),
    ),
    (
        "unknown architecture",
        re.compile(
            r"not supported for now|Model architectures .* are not supported|"
            r"does not recognize this architecture|Unrecognized model in|"
            r"Should have a `model_type` key",
            re.I,
        ),
    ),
    (
        "CUDA or driver mismatch",
        re.compile(
            r"driver version is insufficient|CUDA driver|no kernel image|"
            r"cudaErrorInsufficientDriver|NVIDIA driver on your system is too old",
            re.I,
        ),
    ),
)


def start_cause(text: str) -> str:
    """The named cause of a failed start, from its error and log; "unclassified" else."""
    for cause, pattern in START_CAUSES:
        if pattern.search(text):
            return cause
    return "unclassified"
