"""fleet.toml's typed model: its sections, nodes, models, deployments, launch profiles and
drills (pydantic, strict and frozen), and the errors a fleet's reader raises.

This is the bottom of the fleet file: the modules that need only its types (launch argv,
the plugin interface, drill templates, the engine plugins) import this module, because
console.core.config.load, which reads and checks a file, imports them. Secrets never live in
the file: it names environment variables, and `Fleet.secret` reads them, failing with the
line that named the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from console.core.config import names as allowed
from console.core.config.tomlpos import Path as KeyPath
from console.core.config.tomlpos import format_path, line_of

DEFAULT_VIEWER_ENV = "ENGINEROOM_VIEWER_TOKEN"
DEFAULT_OPERATOR_ENV = "ENGINEROOM_OPERATOR_TOKEN"
DEFAULT_ADMIN_ENV = "ENGINEROOM_ADMIN_TOKEN"
DEFAULT_GATEWAY_VIEWER_ENV = "ENGINEROOM_GATEWAY_VIEWER_TOKEN"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    """A problem in fleet.toml, already worded for the operator: `path:line: what`."""


class MissingSecret(ConfigError):
    """The environment variable that the file names for a secret is not set.

    The file itself is fine: a command that reads many nodes shows the one node as
    `no token (NAME is not set)` and goes on with the rest; only a command that needs
    this very secret stops."""

    def __init__(self, message: str, env_name: str) -> None:
        super().__init__(message)
        self.env_name = env_name

    @property
    def short(self) -> str:
        return f"{self.env_name} is not set"


DEFAULT_STOP_GRACE_S = 30.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


EnvName = Annotated[str, Field(pattern=_ENV_NAME.pattern)]
Seconds = Annotated[float, Field(gt=0)]
Port = Annotated[int, Field(ge=1, le=65535)]


class FleetSection(_Strict):
    name: str
    _name_ok = field_validator("name")(allowed.text)
    environment: str = "dev"
    refresh_s: Seconds = 1.0
    read_only: bool | None = None  # None: read-only exactly when environment is "prod"
    # How the console reads agents: one long-lived snapshot stream per node, or a request
    # per node per refresh (bench/console_scale.py measures both).
    collect: Literal["stream", "poll"] = "stream"
    # Agentless nodes (ssh = "user@host"): how often, how many sessions at once, how long.
    ssh_refresh_s: Seconds = 5.0
    ssh_concurrency: Annotated[int, Field(ge=1, le=1024)] = 16
    ssh_timeout_s: Seconds = 10.0


class AgentSection(_Strict):
    """How every agent of this fleet behaves (one section; nodes differ only by name)."""

    listen: str = "127.0.0.1:9410"
    scrape_interval_s: Seconds = 2.0
    window_s: Seconds = 60.0
    probe_timeout_s: Seconds = 2.0
    max_response_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    # Open HTTP connections (snapshot streams included); beyond it the agent answers 503.
    max_connections: Annotated[int, Field(ge=2, le=65536)] = 256
    discover: bool = True  # find engines from the node's processes, beyond the deployments
    disk_paths: list[str] = Field(default_factory=list)  # model and engine directories
    viewer_token_env: EnvName = DEFAULT_VIEWER_ENV
    operator_token_env: EnvName = DEFAULT_OPERATOR_ENV
    state_dir: str = "~/.local/state/engineroom"  # jobs database, engine pid files and logs
    engine_log_max_bytes: Annotated[int, Field(ge=4096)] = 16 * 1024 * 1024  # per file
    engine_log_keep: Annotated[int, Field(ge=1, le=20)] = 3  # rotated files kept besides it
    # SIGTERM to SIGKILL for whatever the agent stops: a profile's engine (unless the
    # profile sets its own), an engine found among the processes, a drill's tools.
    stop_grace_s: Seconds = DEFAULT_STOP_GRACE_S


class Node(_Strict):
    name: str
    agent: str | None = None  # agent URL
    token_env: EnvName | None = None
    ssh: str | None = None  # user@host, for agentless nodes
    ssh_port: Port | None = None
    ssh_key: str | None = None
    ssh_known_hosts: str | None = None  # default ~/.ssh/known_hosts
    ssh_trust_on_first_use: bool = False  # add an unknown host's key to ssh_known_hosts
    # What runs on the host; the console falls back to nvidia-smi when it is not there.
    ssh_agent_command: list[str] = Field(
        default_factory=lambda: ["engineroom", "agent", "--once", "--json"]
    )
    _name_ok = field_validator("name")(allowed.an_id)

    @model_validator(mode="after")
    def _reachable(self) -> Node:
        if self.ssh is not None and not self.ssh.rpartition("@")[2]:
            raise ValueError(f"ssh: wants user@host or host, got {self.ssh!r}")
        return self

    @property
    def transport(self) -> Literal["agent", "ssh", "prometheus"]:
        return "agent" if self.agent else "ssh" if self.ssh else "prometheus"


class GatewaySection(_Strict):
    """The gateway: the fleet's one OpenAI front door (console.gateway)."""

    url: str  # where consoles and the CLI reach it
    token_env: EnvName = DEFAULT_ADMIN_ENV  # the admin token (routes, failovers)
    # A token that reads the admin API and /metrics and cannot act (web views, Prometheus);
    # optional: unset in the gateway's environment, there is none.
    viewer_token_env: EnvName = DEFAULT_GATEWAY_VIEWER_ENV
    listen: str | None = None  # HOST:PORT; default the host and port of `url`
    api_keys_env: EnvName | None = None  # client keys (comma-separated) for the front door
    state_dir: str = "~/.local/state/engineroom/gateway"  # routes, jobs and audit (SQLite)
    health_interval_s: Seconds = 1.0  # active checks of every deployment
    connect_timeout_s: Seconds = 2.0
    read_timeout_s: Seconds = 600.0  # between two chunks of an answer
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    window_s: Seconds = 60.0  # the gateway's own latency and error windows
    # Bounds on what a client or an engine can make the gateway hold (docs/gateway.md).
    max_response_bytes: Annotated[int, Field(ge=1024)] = 16 * 1024 * 1024  # past it: 502
    head_timeout_s: Seconds = 30.0  # for the next request, from connect or the last answer
    write_timeout_s: Seconds = 30.0  # a client that reads nothing this long is cut
    max_connections: Annotated[int, Field(ge=1)] = 4096  # client connections open at once


class DataPlaneSection(_Strict):
    """A data plane that carries some models' traffic (console.gateway.dataplanes.base): HAProxy
    or the vLLM router, driven by the gateway's failover jobs. The built-in gateway is the
    default and needs no entry."""

    name: str
    kind: str  # haproxy | vllm-router
    url: str | None = None  # its HTTP front (clients, the vLLM router's API)
    admin_socket: str | None = None  # HAProxy: the runtime API's stats socket (level admin)
    config: str | None = None  # HAProxy: the configuration it runs (rendered or adopted)
    listen: str | None = None  # HAProxy render: HOST:PORT of its front end
    metrics_url: str | None = None  # the vLLM router: its Prometheus endpoint
    token_env: EnvName | None = None  # a token for its API, where it has one
    timeout_s: Seconds = 2.0  # each call to it
    # HAProxy render: who owns the stats socket, the gateway's user (deploy/README.md).
    socket_user: str = "engineroom"
    socket_group: str = "engineroom"
    _name_ok = field_validator("name")(allowed.an_id)
    _paths_ok = field_validator("admin_socket", "config", "listen")(allowed.path)
    _owner_ok = field_validator("socket_user", "socket_group")(allowed.unix_user)


class Slo(_Strict):
    ttft_p95_ms: Annotated[float, Field(gt=0)] | None = None
    itl_p95_ms: Annotated[float, Field(gt=0)] | None = None
    e2e_p95_ms: Annotated[float, Field(gt=0)] | None = None
    error_rate: Annotated[float, Field(ge=0, le=1)] | None = None


class DiagnosisLimits(_Strict):
    """When a diagnosis is raised: `[diagnoses]` for the fleet, `[models.diagnoses]` for
    one model. An unset key takes the fleet's, then the default in
    console/core/diagnosis.py (docs/diagnoses.md gives each)."""

    wedged_after_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    triton_stall_after_s: Annotated[float, Field(gt=0, le=3600)] | None = None
    crash_loop_exits: Annotated[int, Field(ge=2, le=32)] | None = None  # the agent keeps 32
    crash_loop_window_s: Annotated[float, Field(gt=0, le=3600)] | None = None  # and an hour
    kv_pressure_usage: Annotated[float, Field(gt=0, le=1)] | None = None
    kv_preemption_storm_rate: Annotated[float, Field(gt=0, le=100_000)] | None = None
    saturated_gap_times: Annotated[float, Field(ge=1.5, le=1000)] | None = None
    saturated_cpu_pct: Annotated[float, Field(gt=0, le=100)] | None = None
    imbalance_times: Annotated[float, Field(ge=1.5, le=1000)] | None = None
    error_burst_rate: Annotated[float, Field(gt=0, le=1)] | None = None


class Deployment(_Strict):
    id: str
    node: str
    engine: str  # plugin name: vllm | triton | trtllm | any registered third-party plugin
    endpoint: str
    engine_model: str | None = None  # the engine's own name for the model
    metrics_endpoint: str | None = None  # where it differs from endpoint (Triton: port 8002)
    weight: Annotated[int, Field(ge=0)] = 100
    profile: str | None = None
    # Triton: how the gateway renders chat messages into one text_input ({role}, {content}).
    chat_template: str = "{role}: {content}\n"
    chat_prompt_suffix: str = "assistant:"
    # TensorRT-LLM: the engine directory this deployment serves. The agent reads its
    # engineroom manifest to tell whether it went stale; a drill's promote re-points it
    # when it is a symbolic link.
    engine_dir: str | None = None
    # A data plane's own name for this deployment (HAProxy: its server in the model's
    # backend); default derived from the id.
    server: str | None = None
    _names_ok = field_validator("id", "node")(allowed.an_id)
    _server_ok = field_validator("server")(allowed.haproxy_name)
    _engine_model_ok = field_validator("engine_model")(allowed.text)

    @field_validator("endpoint", "metrics_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value.rstrip("/") if value else value


class FailoverPlan(_Strict):
    """How a planned failover shifts a model's traffic (POST /admin/failover)."""

    steps: list[Annotated[int, Field(gt=0, le=100)]] = Field(default_factory=lambda: [10, 50, 100])
    verify_s: Seconds = 10.0  # the verification window after each step
    warmup_requests: Annotated[int, Field(ge=0)] = 5
    drain_timeout_s: Seconds = 120.0
    canary_prompt: str = "Say hello."


class Model(_Strict):
    name: str
    slo: Slo = Slo()
    deployments: list[Deployment] = Field(default_factory=list)
    auto_failover: bool = False  # the gateway moves traffic itself when a deployment dies
    failover: FailoverPlan = FailoverPlan()
    dataplane: str = "gateway"  # a [[dataplanes]] name; "gateway": the built-in one
    backend: str | None = None  # the data plane's name for the model (HAProxy backend)
    diagnoses: DiagnosisLimits = DiagnosisLimits()
    _name_ok = field_validator("name")(allowed.model_name)
    _dataplane_ok = field_validator("dataplane")(allowed.an_id)
    _backend_ok = field_validator("backend")(allowed.haproxy_name)


ArgValue = str | int | float | bool


class Profile(_Strict):
    """What an agent may launch. The agent builds the argv itself, never through a shell."""

    engine: str
    node: str
    model: str
    served_model_name: str
    port: Port
    gpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    args: dict[str, ArgValue] = Field(default_factory=dict)
    command: list[str] | None = None  # argv prefix; default per engine plugin
    env: dict[str, str] = Field(default_factory=dict)
    overridable: list[str] = Field(default_factory=list)
    allowed_args: list[str] = Field(default_factory=list)
    ready_timeout_s: Seconds = 900.0  # process start to ready, or the start job fails
    cold_start_budget_s: Seconds | None = None  # longer: the slow cold start diagnosis
    # SIGTERM to SIGKILL; vLLM drains for this less 5 s. Unset: [agent] stop_grace_s.
    stop_grace_s: Seconds = DEFAULT_STOP_GRACE_S


Precision = Literal["fp16", "bf16", "fp8", "int8-sq", "int4-awq", "w4a8-awq", "nvfp4"]
DrillStepName = Literal["preflight", "convert", "build", "serve"]


class DrillShapes(_Strict):
    """The shape range the engine is built for (trtllm-build's limits)."""

    max_batch_size: Annotated[int, Field(ge=1)] = 64
    max_input_len: Annotated[int, Field(ge=1)] = 4096
    max_seq_len: Annotated[int, Field(ge=1)] = 8192
    max_num_tokens: Annotated[int, Field(ge=1)] = 8192


class DrillPins(_Strict):
    """The versions the drill expects on the node; a mismatch fails its preflight."""

    driver: str | None = None
    cuda: str | None = None
    tensorrt: str | None = None
    tensorrt_llm: str | None = None
    compute_capability: str | None = None
    gpu: str | None = None


class DrillStep(_Strict):
    """One step's argv template ({placeholders}), timeout and success condition."""

    argv: list[str] | None = None  # None: the pipeline's shipped template
    timeout_s: Seconds = 3600.0
    expect_files: list[str] | None = None  # must exist after it; None: the template's
    expect_output: str | None = None  # a regular expression its output must contain


class DrillValidate(_Strict):
    """The candidate against the baseline: a fixed prompt set, greedy."""

    prompts: list[str] = Field(
        default_factory=lambda: [
            "The capital of France is",
            "Write a haiku about GPUs.",
            "def fibonacci(n):",
            "Translate to German: good morning",
            "List three prime numbers:",
            "Summarize: the engine was rebuilt after a driver upgrade.",
            "Q: What is 12 * 12? A:",
            "Once upon a time",
        ]
    )
    max_tokens: Annotated[int, Field(ge=1, le=4096)] = 32
    first_n: Annotated[int, Field(ge=1)] = 8  # tokens compared for first-N agreement
    min_exact_match: Annotated[float, Field(ge=0, le=1)] = 0.75
    min_first_n: Annotated[float, Field(ge=0, le=1)] = 0.9
    timeout_s: Seconds = 600.0


class DrillBenchmark(_Strict):
    """A concurrency sweep of the candidate and the baseline, and optional gates."""

    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 4, 16, 64]
    )
    requests_per_level: Annotated[int, Field(ge=1)] | None = None  # default 2 x level, >= 8
    max_tokens: Annotated[int, Field(ge=1)] = 64
    prompt: str = "Explain in one paragraph why inference engines are rebuilt."
    timeout_s: Seconds = 1800.0
    max_cold_start_s: Seconds | None = None  # gate: the candidate's cold start
    max_ttft_p95_ratio: Annotated[float, Field(gt=0)] | None = None  # gate: vs the baseline
    max_itl_p95_ratio: Annotated[float, Field(gt=0)] | None = None


class Drill(_Strict):
    """A TensorRT-LLM rebuild drill: preflight, convert, build, validate, benchmark,
    promote (console.agent.drills.job)."""

    model: str  # a [[models]] name
    deployment: str  # the TensorRT-LLM deployment it rebuilds
    pipeline: Literal["engine", "pytorch"] = "engine"  # trtllm-build, or trtllm-serve's load
    precision: Precision = "bf16"
    checkpoint: str  # the Hugging Face checkpoint directory on the node
    engine_cache: str = "~/.local/state/engineroom/engine-cache"
    tp_size: Annotated[int, Field(ge=1)] = 1
    shapes: DrillShapes = DrillShapes()
    pins: DrillPins = DrillPins()
    baseline: str | None = None  # deployment id; default the model's vLLM deployment
    examples_dir: str = "/opt/TensorRT-LLM/examples"  # convert_checkpoint.py, quantize.py
    family: str = "llama"  # examples/models/core/FAMILY/convert_checkpoint.py
    serve_port: Port = 8012  # where the candidate listens during validate and benchmark
    env: dict[str, str] = Field(default_factory=dict)
    steps: dict[DrillStepName, DrillStep] = Field(default_factory=dict)
    validate_: DrillValidate = Field(DrillValidate(), alias="validate")
    benchmark: DrillBenchmark = DrillBenchmark()
    use_cache: bool = True  # a build key already in the cache skips convert and build
    link_engine_dir: bool = True  # promote re-points the deployment's engine_dir link


LabelName = Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]  # Prometheus' rule


class PrometheusLabels(_Strict):
    """Which labels name what, in the series Prometheus holds. The defaults match
    dcgm-exporter (`Hostname`, `gpu`), the agent's own series (`node`, `gpu`) and engines
    scraped directly (their `instance` is matched to a deployment's endpoint)."""

    node: list[LabelName] = Field(default_factory=lambda: ["node", "Hostname"])  # first wins
    gpu: LabelName = "gpu"
    # The label that names the model, by engine kind; a kind not here uses its plugin's.
    model: dict[str, LabelName] = Field(default_factory=dict)


class PrometheusSection(_Strict):
    """Read the fleet from a Prometheus that already scrapes it (console.collect.prometheus.source):
    telemetry from Prometheus, actions through the agents fleet.toml names."""

    url: str
    token_env: EnvName | None = None  # a bearer token
    username_env: EnvName | None = None  # basic auth: both, or neither
    password_env: EnvName | None = None
    verify_tls: bool = True
    ca_file: str | None = None
    window_s: Annotated[float, Field(ge=10)] = 60.0  # rate() and histogram_quantile() window
    timeout_s: Seconds = 5.0  # one query's deadline
    max_response_bytes: Annotated[int, Field(ge=1024)] = 256 * 1024 * 1024
    # One refresh's answers together (they are held, decoded, until it ends).
    max_refresh_bytes: Annotated[int, Field(ge=1024)] = 256 * 1024 * 1024
    discover: bool = True  # nodes found in the series join those fleet.toml names
    history_s: Annotated[float, Field(ge=60)] = 3600.0  # what Model detail reads back
    # Read the latency and rate figures from recording rules (console.collect.prometheus.promql
    # --recording-rules writes them) instead of evaluating them each refresh: past a few
    # thousand nodes, Prometheus' time per refresh (docs/scale.md).
    recorded: bool = False
    labels: PrometheusLabels = PrometheusLabels()

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _auth(self) -> PrometheusSection:
        if (self.username_env is None) != (self.password_env is None):
            raise ValueError("basic auth needs both username_env and password_env")
        if self.token_env and self.username_env:
            raise ValueError("token_env (bearer) and username_env (basic auth): choose one")
        return self


class Thresholds(_Strict):
    """When the console raises an alert."""

    gpu_temp_warn_c: float = 83.0
    gpu_temp_crit_c: float = 90.0
    kv_cache_warn: Annotated[float, Field(gt=0, le=1)] = 0.95
    queue_growth_polls: Annotated[int, Field(ge=2)] = 5  # waiting rose this many polls in a row
    queue_min: Annotated[float, Field(ge=0)] = 1.0  # ... and ended at least this high
    error_rate: Annotated[float, Field(ge=0, le=1)] = 0.05  # when a model's SLO names none


class Fleet(_Strict):
    fleet: FleetSection
    agent: AgentSection = AgentSection()
    thresholds: Thresholds = Thresholds()
    diagnoses: DiagnosisLimits = DiagnosisLimits()
    keys: dict[str, str] = Field(default_factory=dict)  # action id -> key, remaps the TUI
    nodes: list[Node] = Field(default_factory=list)
    gateway: GatewaySection | None = None
    prometheus: PrometheusSection | None = None
    dataplanes: list[DataPlaneSection] = Field(default_factory=list)
    models: list[Model] = Field(default_factory=list)
    profiles: dict[str, Profile] = Field(default_factory=dict)
    drills: dict[str, Drill] = Field(default_factory=dict)

    # Where the fleet came from, for messages; not part of the file.
    source: Path = Field(default=Path("fleet.toml"), exclude=True)
    lines: dict[KeyPath, int] = Field(default_factory=dict, exclude=True)

    @model_validator(mode="after")
    def _agent_grace(self) -> Fleet:
        """A profile without its own stop_grace_s takes the agent's: one setting."""
        for name, profile in self.profiles.items():
            if "stop_grace_s" not in profile.model_fields_set:
                grace = {"stop_grace_s": self.agent.stop_grace_s}
                self.profiles[name] = profile.model_copy(update=grace)
        return self

    @property
    def read_only(self) -> bool:
        if self.fleet.read_only is not None:
            return self.fleet.read_only
        return self.fleet.environment == "prod"

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes) or "none"
        raise ConfigError(f"{self.source}: no node named {name!r} (nodes: {known})")

    def deployments_on(self, node: str) -> list[tuple[Model, Deployment]]:
        return [(m, d) for m in self.models for d in m.deployments if d.node == node]

    def deployment(self, deployment_id: str) -> tuple[Model, Deployment] | None:
        for model in self.models:
            for dep in model.deployments:
                if dep.id == deployment_id:
                    return model, dep
        return None

    def where(self, path: KeyPath) -> str:
        line = line_of(self.lines, path)
        return f"{self.source}:{line}" if line else str(self.source)

    def secret(self, env_name: str, path: KeyPath, environ: Mapping[str, str] | None = None) -> str:
        """The value of the environment variable that `path` in the file names."""
        value = (os.environ if environ is None else environ).get(env_name, "")
        if not value.strip():
            raise MissingSecret(
                f"{self.where(path)}: {format_path(path)}: environment variable {env_name} "
                "is not set (secrets come from the environment, never from the file)",
                env_name,
            )
        return value
