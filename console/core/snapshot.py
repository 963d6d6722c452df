"""The console's reading of the wire formats in console.core.wire.

The agent serves pydantic models (console.core.wire: they are its schema and its OpenAPI).
The console decodes the same JSON into the msgspec structs below, because at 1,000 nodes
it decodes 1,000 snapshots a second and keeps each for a while:
- decoding is about 3x faster than pydantic's validate_json (docs/evidence);
- a struct is one object with no __dict__, fields-set or extras beside it, and it is not
  tracked by the garbage collector (gc=False: none of these can form a cycle), so the
  collector's young generation is not full of snapshots that are about to be replaced.

The fields, their types and their defaults mirror console.core.wire field for field:
tests/test_snapshot_types.py fails when the two drift. Unknown keys from a newer agent are
ignored here (the pydantic models keep them; the console has no use for them).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

EngineState = Literal["ready", "loading", "unhealthy", "down"]
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
StepState = Literal["pending", "running", "succeeded", "failed", "skipped", "cancelled"]


class _Struct(msgspec.Struct, kw_only=True, gc=False):
    pass


class NodeInfo(_Struct, kw_only=True):
    name: str
    agent_version: str
    time: float  # unix seconds when the snapshot was taken
    hostname: str | None = None


class Disk(_Struct, kw_only=True):
    path: str
    mount: str | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None
    error: str | None = None


class Host(_Struct, kw_only=True):
    cpu_pct: float | None = None
    cpu_count: int | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    disks: list[Disk] = msgspec.field(default_factory=list)
    error: str | None = None


class GpuProcess(_Struct, kw_only=True):
    pid: int
    used_memory_bytes: int | None = None
    engine_id: str | None = None
    name: str | None = None


class XidEvent(_Struct, kw_only=True):
    time: float
    xid: int


class GoneGpu(_Struct, kw_only=True):
    uuid: str
    index: int | None = None
    name: str | None = None
    last_seen: float | None = None


class Gpu(_Struct, kw_only=True):
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
    compute_capability: str | None = None
    mig_mode: bool | None = None
    ecc_uncorrected: int | None = None
    remapped_rows: dict[str, Any] | None = None
    clock_event_reasons: list[str] | None = None
    xid_events: list[XidEvent] = msgspec.field(default_factory=list)
    processes: list[GpuProcess] | None = None
    errors: list[str] = msgspec.field(default_factory=list)


class Percentiles(_Struct, kw_only=True):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    count: float | None = None
    source: Literal["histogram", "mean"] | None = None

    @property
    def p95_or_mean(self) -> float | None:
        """The p95 where a histogram gave one, else the windowed mean; None if neither."""
        return self.p95 if self.p95 is not None else self.mean


class Latency(_Struct, kw_only=True):
    ttft_s: Percentiles = msgspec.field(default_factory=Percentiles)
    itl_s: Percentiles = msgspec.field(default_factory=Percentiles)
    e2e_s: Percentiles = msgspec.field(default_factory=Percentiles)


class ModelStats(_Struct, kw_only=True):
    name: str
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    request_rate: float | None = None
    error_rate: float | None = None
    prompt_tokens_rate: float | None = None
    generation_tokens_rate: float | None = None
    preemption_rate: float | None = None
    generation_stalled_s: float | None = None
    completion_stalled_s: float | None = None
    prefix_cache_hit_rate: float | None = None
    requests_waiting_by_reason: dict[str, float] | None = None
    latency: Latency = msgspec.field(default_factory=Latency)
    window_s: float | None = None


class Engine(_Struct, kw_only=True):
    id: str
    kind: str
    endpoint: str | None = None
    version: str | None = None
    state: EngineState
    reason: str | None = None
    pid: int | None = None
    deployment_ids: list[str] = msgspec.field(default_factory=list)
    discovered: bool = False
    models: list[ModelStats] = msgspec.field(default_factory=list)
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    probe_ms: float | None = None
    profile: str | None = None
    api_server_cpu_pct: float | None = None
    exits: list[float] = msgspec.field(default_factory=list)


class JobStep(_Struct, kw_only=True):
    name: str
    state: StepState = "pending"
    started: float | None = None
    ended: float | None = None
    detail: str | None = None


class Job(_Struct, kw_only=True):
    id: str
    kind: str
    state: JobState
    who: str | None = None
    created: float | None = None
    updated: float | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    steps: list[JobStep] = msgspec.field(default_factory=list)
    error: str | None = None
    result: dict[str, Any] = msgspec.field(default_factory=dict)


class TrtEngine(_Struct, kw_only=True):
    deployment: str
    model: str
    engine_dir: str | None = None
    state: Literal["current", "stale", "unknown"]
    reasons: list[str] = msgspec.field(default_factory=list)
    unchecked: list[str] = msgspec.field(default_factory=list)
    note: str | None = None
    build_key: str | None = None
    built: float | None = None
    built_with: dict[str, Any] = msgspec.field(default_factory=dict)
    last_drill: dict[str, Any] | None = None
    backend: Literal["engine", "pytorch"] | None = None


# A gpu_status saying the source has not read the GPUs yet (Prometheus' first read shows
# the nodes before its GPU queries answer): how many there are is unknown, not 0.
GPUS_NOT_READ = "GPUs not read yet (first read under way)"


class Snapshot(_Struct, kw_only=True):
    node: NodeInfo
    host: Host
    gpu_status: str
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[Gpu] = msgspec.field(default_factory=list)
    gpus_gone: list[GoneGpu] = msgspec.field(default_factory=list)
    engines: list[Engine] = msgspec.field(default_factory=list)
    jobs: list[Job] = msgspec.field(default_factory=list)
    trt_engines: list[TrtEngine] = msgspec.field(default_factory=list)
    cycle: dict[str, float | None] = msgspec.field(default_factory=dict)
    source: str = "agent"
    missing: list[str] = msgspec.field(default_factory=list)


class SnapshotError(ValueError):
    """A snapshot that does not decode: says where in the document and why."""


_snapshot = msgspec.json.Decoder(Snapshot)


def decode_snapshot(body: bytes | str) -> Snapshot:
    try:
        return _snapshot.decode(body)
    except msgspec.ValidationError as e:  # "Expected `int`, got `str` - at `$.gpus[0].index`"
        raise SnapshotError(f"not a snapshot: {e}") from None
    except msgspec.DecodeError as e:
        raise SnapshotError(f"not JSON: {e}") from None


def snapshot_from(data: Any) -> Snapshot:
    """From plain JSON values (a dict), as read from a file or another API."""
    try:
        return msgspec.convert(data, Snapshot)
    except msgspec.ValidationError as e:
        raise SnapshotError(f"not a snapshot: {e}") from None


def job_from(data: Any) -> Job:
    try:
        return msgspec.convert(data, Job)
    except msgspec.ValidationError as e:
        raise SnapshotError(f"not a job: {e}") from None


def plain(value: Any) -> Any:
    """Plain JSON values (dicts, lists) of a struct, for `--json` output and files."""
    return msgspec.to_builtins(value)
