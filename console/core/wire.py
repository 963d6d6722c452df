"""Wire formats shared by the agent (server) and the collector (client).

The snapshot keys are a contract (docs/architecture.md). Unknown values are None (JSON null),
never 0: a GPU whose temperature could not be read has `temperature_c: null`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from console.core import launch

EngineState = Literal["ready", "loading", "unhealthy", "down"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer agents may add keys; keep them


class NodeInfo(_Wire):
    name: str
    agent_version: str
    time: float  # unix seconds when the snapshot was taken
    hostname: str | None = None


class Disk(_Wire):
    path: str
    mount: str | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None
    error: str | None = None


class Host(_Wire):
    cpu_pct: float | None = None
    cpu_count: int | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    disks: list[Disk] = Field(default_factory=list)
    error: str | None = None  # why these values are old (a statistics call hung)


class GpuProcess(_Wire):
    pid: int
    used_memory_bytes: int | None = None
    engine_id: str | None = None  # the engine that owns the pid, when known
    name: str | None = None  # process name


class XidEvent(_Wire):
    time: float
    xid: int


class GoneGpu(_Wire):
    """A GPU the node had that NVML no longer lists (console/agent/snapshot/gpu_inventory.py)."""

    uuid: str
    index: int | None = None  # its index then
    name: str | None = None
    last_seen: float | None = None  # Unix time NVML last listed it


class Gpu(_Wire):
    index: int
    uuid: str | None = None
    name: str | None = None
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    compute_capability: str | None = None  # "9.0"
    mig_mode: bool | None = None
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors
    remapped_rows: dict[str, Any] | None = (
        None  # {"correctable","uncorrectable","pending","failure"}
    )
    clock_event_reasons: list[str] | None = None
    xid_events: list[XidEvent] = Field(default_factory=list)
    processes: list[GpuProcess] | None = None
    errors: list[str] = Field(default_factory=list)  # fields NVML could not read, and why


class Percentiles(_Wire):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    count: float | None = None  # observations in the window
    # "histogram": percentiles from bucket deltas; "mean": only a windowed mean is known.
    source: Literal["histogram", "mean"] | None = None

    @property
    def p95_or_mean(self) -> float | None:
        """The p95 where a histogram gave one, else the windowed mean; None if neither.

        What an SLO on p95 is checked against, and what history plots, for every engine.
        """
        return self.p95 if self.p95 is not None else self.mean


class Latency(_Wire):
    ttft_s: Percentiles = Field(default_factory=Percentiles)
    itl_s: Percentiles = Field(default_factory=Percentiles)
    e2e_s: Percentiles = Field(default_factory=Percentiles)


class ModelStats(_Wire):
    name: str
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    request_rate: float | None = None  # finished requests per second over the window
    error_rate: float | None = None  # failed / finished over the window
    prompt_tokens_rate: float | None = None  # tokens per second over the window
    generation_tokens_rate: float | None = None
    preemption_rate: float | None = Field(
        default=None, description="requests preempted per second over the last 10 s of the window"
    )
    generation_stalled_s: float | None = Field(
        default=None,
        description="seconds that requests have been in (running or waiting) with no token "
        "generated, as far back as the agent's window sees; 0 with nothing in; null where "
        "the engine counts no tokens",
    )
    completion_stalled_s: float | None = Field(
        default=None,
        description="seconds that requests have been in (running or waiting) with no request "
        "finished, as far back as the agent's window sees; 0 with nothing in; null where the "
        "engine counts no finished requests",
    )
    prefix_cache_hit_rate: float | None = Field(
        default=None,
        description="prefix-cache hits / queries (tokens) over the window, 0..1; "
        "null when nothing was queried",
    )
    requests_waiting_by_reason: dict[str, float] | None = Field(
        default=None,
        description="reason (vLLM: capacity, deferred) -> requests waiting, at most 16; "
        "null where the engine does not say why (vLLM up to 0.12, Triton, trtllm-serve)",
    )
    latency: Latency = Field(default_factory=Latency)
    window_s: float | None = None  # the span the rates and percentiles cover


class Engine(_Wire):
    id: str
    kind: str
    endpoint: str | None = None
    version: str | None = None
    state: EngineState
    reason: str | None = None  # why it is not ready, or what could not be read
    pid: int | None = None
    deployment_ids: list[str] = Field(default_factory=list)
    discovered: bool = False  # found among the node's processes
    models: list[ModelStats] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    probe_ms: float | None = None
    profile: str | None = None  # set when this agent started it from a launch profile
    api_server_cpu_pct: float | None = Field(
        default=None,
        description="% of one core used by the engine's API server process (vLLM's API "
        "server, not its EngineCore child) over the agent's last cycle (read from "
        "Prometheus: over its window); null where the engine has no API server apart from "
        "its compute (Triton, trtllm-serve), or its process is not known to the agent",
    )
    exits: list[float] = Field(
        default_factory=list,
        description="when (Unix time) the engine's process exited with no stop asked of the "
        "agent, oldest first: seen dead, or replaced by a new process on its port; the last "
        "32 within the hour (the crash-loop diagnosis counts them)",
    )


# A vLLM cold start's phases, in order (console.agent.jobs.runner finds them in the engine's log).
COLD_START_PHASES = (
    "engine_init",
    "weights_loaded",
    "kv_cache_allocated",
    "graphs_captured",
    "server_up",
    "ready",
)
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
StepState = Literal["pending", "running", "succeeded", "failed", "skipped", "cancelled"]


class JobStep(_Wire):
    name: str  # preflight | spawn | load | stop | ...
    state: StepState = "pending"
    started: float | None = None  # wall clock
    ended: float | None = None
    detail: str | None = None


class Job(_Wire):
    """A long operation on the agent (docs/architecture.md: jobs). `result` is kind-specific,
    plain JSON whose keys the models below name: EngineJobResult (vllm.start, engine.stop,
    engine.restart: `argv`, `engine_id`, `cold_start`, on failure `log_tail`) and
    DrillResult (drill.run: gates, versions, build key, validate, benchmark)."""

    id: str
    kind: str  # vllm.start | engine.stop | engine.restart | drill.run
    state: JobState
    who: str | None = None  # the token's name, never the token
    created: float | None = None
    updated: float | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    steps: list[JobStep] = Field(default_factory=list)
    error: str | None = None
    result: dict[str, Any] = Field(default_factory=dict)


# -- job requests (POST /v1/jobs): one model per kind, told apart by `kind` ----------------
# The schema says what the agent takes whatever its fleet: a name that is not here answers
# 404, a request outside the profile 422, one the node's state refuses now 409
# (docs/jobs.md). Names are those of fleet.toml: never empty, no control characters.

_NO_CONTROL = r"^[^\x00-\x1f\x7f]+$"
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=_NO_CONTROL)]


def _overrides_schema(schema: dict[str, Any]) -> None:
    """The keys and values console.core.launch.apply_overrides takes from any profile:
    port, gpus, tensor_parallel_size and args.FLAG, each with its type. Which of them a
    profile allows (`overridable`, `allowed_args`), and a flag's type where the profile sets
    one, are the profile's: outside them the agent answers 422 naming the key. The agent
    checks overrides there (its messages name the key); this only documents them."""
    flag_text = {  # a value may not read as a flag, nor break a line
        "type": "string",
        "maxLength": launch.MAX_VALUE_CHARS,
        "pattern": r"^([^-\x00-\x1f\x7f][^\x00-\x1f\x7f]*)?$",
    }
    schema.clear()
    schema.update(
        type="object",
        title="Overrides",
        properties={
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "gpus": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "tensor_parallel_size": {"type": "integer", "minimum": 1},
            # The agent sets these flags itself from the profile.
            **{f"args.{name}": False for name in launch.AGENT_FLAGS},
        },
        patternProperties={
            r"^args\.[a-z][a-z0-9_]*$": {
                "anyOf": [flag_text, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}]
            }
        },
        additionalProperties=False,
    )


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not ignored


class VllmStart(_Request):
    """Preflight, spawn and load a launch profile of this node."""

    kind: Literal["vllm.start"]
    profile: Name
    # Checked against the profile by console.core.launch, which names the key it refuses.
    overrides: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_overrides_schema)

    @field_validator("overrides")
    @classmethod
    def _whole_numbers(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        """JSON does not tell 8001 from 8001.0, and JSON Schema calls both an integer: where
        the schema wants an integer, a whole float goes on as one."""
        out = {
            k: whole(v) if k in ("port", "tensor_parallel_size") else v
            for k, v in overrides.items()
        }
        if isinstance(out.get("gpus"), list):
            out["gpus"] = [whole(g) for g in out["gpus"]]
        return out


def whole(value: Any) -> Any:
    """A whole float as the int it is (JSON's 8001.0 is JSON Schema's integer 8001);
    anything else as it came, for the type check after this one to take or refuse."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class EngineStop(_Request):
    """Stop an engine (drain, then SIGKILL after the grace)."""

    kind: Literal["engine.stop"]
    engine: Name


class EngineRestart(_Request):
    """Stop an engine this agent started, then start its profile again."""

    kind: Literal["engine.restart"]
    engine: Name


class DrillRun(_Request):
    """Run a TensorRT-LLM rebuild drill of this node."""

    kind: Literal["drill.run"]
    drill: Name


class WhatIf(_Request):
    """A hypothetical node for POST /v1/drills/what-if: any of its facts (null: as now)."""

    driver: str | None = None
    cuda: str | None = None
    tensorrt: str | None = None
    tensorrt_llm: str | None = None
    gpu: str | None = None
    compute_capability: str | None = None


JobRequest = Annotated[
    VllmStart | EngineStop | EngineRestart | DrillRun, Field(discriminator="kind")
]
JOB_KINDS = ("vllm.start", "engine.stop", "engine.restart", "drill.run")


# -- job results (Job.result), per kind; stored and sent as plain JSON ---------------------


class ColdStart(_Wire):
    """Seconds from the spawn to each phase vLLM logged (null: its line never came) and to
    ready."""

    phases: dict[str, float | None] = Field(default_factory=dict)
    total_s: float | None = None


class EngineJobResult(_Wire):
    """vllm.start, engine.stop, engine.restart."""

    engine_id: str
    endpoint: str | None = None
    argv: list[str] | None = None
    cold_start: ColdStart | None = None
    snapshot_state: str | None = None  # the engine's state in the agent's snapshot at ready
    stopped: str | None = None  # how a cancelled start's engine was stopped
    note: str | None = None
    log_tail: list[str] | None = None  # on failure
    exit_code: int | None = None


class Gate(_Wire):
    gate: str
    ok: bool
    detail: str


class DrillResult(_Wire):
    """drill.run: what it rebuilt, the node's versions, every gate, and where it ended."""

    drill: str
    deployment: str
    model: str
    gates: list[Gate] = Field(default_factory=list)
    versions: dict[str, str | None] = Field(default_factory=dict)
    version_sources: dict[str, str] = Field(default_factory=dict)
    build_key: str | None = None
    cache: Literal["hit", "miss"] | None = None
    step_runs: dict[str, Any] = Field(default_factory=dict)
    validate_: dict[str, Any] | None = Field(default=None, alias="validate")
    benchmark: dict[str, Any] | None = None
    promoted: dict[str, Any] | None = None
    time_to_rebuild_s: float | None = None
    log_tail: list[str] | None = None  # on failure


class TrtEngine(_Wire):
    """A TensorRT-LLM deployment's engine against the node as it is now
    (console.agent.drills.job): "current", "stale" (rebuild required, or on the PyTorch
    backend re-validation, with the reasons, such as "driver 575.57 → 580.159") or
    "unknown" (no manifest: unknown provenance)."""

    deployment: str
    model: str
    engine_dir: str | None = None
    state: Literal["current", "stale", "unknown"]
    reasons: list[str] = Field(default_factory=list)
    unchecked: list[str] = Field(default_factory=list)  # facts the agent could not read
    note: str | None = None
    build_key: str | None = None
    built: float | None = None
    built_with: dict[str, Any] = Field(default_factory=dict)
    last_drill: dict[str, Any] | None = None  # {job_id, state, ended, time_to_rebuild_s}
    # The TensorRT-LLM backend it runs: "engine" (a stale one needs a rebuild) or "pytorch"
    # (no build: a stale one needs re-validating); from its manifest, else its drill.
    backend: Literal["engine", "pytorch"] | None = None


class Snapshot(_Wire):
    node: NodeInfo
    host: Host
    gpu_status: str  # "ok", or why NVML is unavailable
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    gpus_gone: list[GoneGpu] = Field(
        default_factory=list,
        description="GPUs this node had (listed by NVML to this agent or an earlier one, kept "
        "in its state folder) that NVML no longer lists: fewer GPUs than the node had",
    )
    engines: list[Engine] = Field(default_factory=list)
    jobs: list[Job] = Field(default_factory=list)
    trt_engines: list[TrtEngine] = Field(default_factory=list)
    cycle: dict[str, float | None] = Field(default_factory=dict)  # the agent's own cost
    # How the console got it: "agent" (HTTP), "ssh" (the agent run once over SSH), or
    # "ssh nvidia-smi" (no engineroom on the host); and what such a reading cannot show.
    source: str = "agent"
    missing: list[str] = Field(default_factory=list)


class Health(_Wire):
    status: Literal["ok"] = "ok"
    version: str


# -- answers besides the snapshot and jobs ------------------------------------------------


class PreflightCheck(_Wire):
    name: str  # port | gpus | model | binary | engine
    ok: bool
    detail: str


class Refusal(_Wire):
    """Every answer of the agent that is not a success (4xx, 503): what was refused, where
    and why, never a token."""

    error: str
    checks: list[PreflightCheck] | None = None  # a vllm.start whose preflight failed


class JobPlan(_Wire):
    """POST /v1/jobs/plan: what a vllm.start would run, and its preflight; starts nothing."""

    profile: str
    engine_id: str
    endpoint: str
    argv: list[str]
    env: dict[str, str]
    checks: list[PreflightCheck]
    ok: bool


class WhoAmI(_Wire):
    name: str  # the token's name, never the token
    role: Literal["viewer", "operator"]
    jobs: bool  # whether this agent runs jobs (it has a state directory)
