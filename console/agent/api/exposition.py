"""The agent's /metrics: GPU and normalized engine metrics in Prometheus text.

Engine-neutral names (`engineroom_model_ttft_seconds{stat="p95"}`) let one Prometheus
query span vLLM, Triton and trtllm-serve. The latency gauges carry a `stat` label (p50,
p95, p99, mean), not `quantile`: they are the agent's windowed figures, not a summary,
and Triton gives only a mean. Unknown values are left out, never written as 0.

The series the alerting rules read (console/core/alertrules.py) are here too: XID
events, row remapping, REBUILD REQUIRED and each declared deployment's state.
"""

from __future__ import annotations

from console.core.wire import Snapshot


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items() if v is not None)


GPU_FIELDS = (
    ("utilization_pct", "engineroom_gpu_utilization_percent", "GPU utilization, 0..100"),
    ("memory_used_bytes", "engineroom_gpu_memory_used_bytes", "GPU memory in use"),
    ("memory_total_bytes", "engineroom_gpu_memory_total_bytes", "GPU memory total"),
    ("temperature_c", "engineroom_gpu_temperature_celsius", "GPU temperature"),
    ("power_w", "engineroom_gpu_power_watts", "GPU power draw"),
    ("power_limit_w", "engineroom_gpu_power_limit_watts", "GPU enforced power limit"),
    ("sm_clock_mhz", "engineroom_gpu_sm_clock_mhz", "SM clock"),
    ("ecc_uncorrected", "engineroom_gpu_ecc_uncorrected_errors", "volatile uncorrected ECC"),
)
MODEL_FIELDS = (
    ("requests_running", "engineroom_model_requests_running", "requests being served"),
    ("requests_waiting", "engineroom_model_requests_waiting", "requests queued"),
    ("kv_cache_usage", "engineroom_model_kv_cache_usage_ratio", "KV cache in use, 0..1"),
    ("request_rate", "engineroom_model_request_rate", "finished requests per second (window)"),
    ("error_rate", "engineroom_model_error_ratio", "failed / finished (window)"),
    (
        "generation_tokens_rate",
        "engineroom_model_generation_tokens_rate",
        "generated tokens per second (window)",
    ),
    (
        "preemption_rate",
        "engineroom_model_preemption_rate",
        "preemptions per second (the last 10 s of the window)",
    ),
    (
        "prefix_cache_hit_rate",
        "engineroom_model_prefix_cache_hit_ratio",
        "prefix-cache hits / queries, 0..1 (window)",
    ),
    (
        "generation_stalled_s",
        "engineroom_model_generation_stalled_seconds",
        "seconds requests have been in with no token generated (as far back as the window)",
    ),
    (
        "completion_stalled_s",
        "engineroom_model_completion_stalled_seconds",
        "seconds requests have been in with no request finished (as far back as the window)",
    ),
)
LATENCY_STATS = (("p50", "p50"), ("p95", "p95"), ("p99", "p99"), ("mean", "mean"))
STATES = ("ready", "loading", "unhealthy", "down")
TRT_STATES = {"stale": 1, "current": 0}  # "unknown" is left out: unknown is not 0


class _Families:
    """Lines grouped by family, each with its HELP and TYPE first, as the format wants."""

    def __init__(self) -> None:
        self.out: list[str] = []

    def family(self, name: str, help_text: str, kind: str = "gauge") -> None:
        self.out.append(f"# HELP {name} {help_text}")
        self.out.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: str, value: float) -> None:
        self.out.append(f"{name}{{{labels}}} {float(value):g}")


def render(snap: Snapshot) -> str:
    f = _Families()
    node = snap.node.name

    f.family("engineroom_nvml_up", "1 when NVML answers on this node")
    f.sample("engineroom_nvml_up", _labels(node=node), int(snap.gpu_status == "ok"))
    for attr, name, help_text in GPU_FIELDS:
        f.family(name, help_text)
        for gpu in snap.gpus:
            value = getattr(gpu, attr)
            if value is not None:
                f.sample(name, _labels(node=node, gpu=gpu.index, uuid=gpu.uuid), value)
    f.family(
        "engineroom_gpu_xid_recent_events",
        "XID events the agent saw on this GPU since it started (the last 20 at most)",
    )
    if snap.gpu_status == "ok":  # no NVML: unknown, not 0
        for gpu in snap.gpus:
            labels = _labels(node=node, gpu=gpu.index, uuid=gpu.uuid)
            f.sample("engineroom_gpu_xid_recent_events", labels, len(gpu.xid_events))
    f.family("engineroom_gpu_xid_last", "the code of the last XID event on this GPU")
    for gpu in snap.gpus:
        if gpu.xid_events:
            labels = _labels(node=node, gpu=gpu.index, uuid=gpu.uuid)
            f.sample("engineroom_gpu_xid_last", labels, gpu.xid_events[-1].xid)
    for key, help_text in (
        ("failure", "1 when row remapping failed on this GPU"),
        ("pending", "1 when a row remapping waits for a GPU reset"),
    ):
        name = f"engineroom_gpu_remapped_rows_{key}"
        f.family(name, help_text)
        for gpu in snap.gpus:
            if gpu.remapped_rows is not None and key in gpu.remapped_rows:
                labels = _labels(node=node, gpu=gpu.index, uuid=gpu.uuid)
                f.sample(name, labels, int(bool(gpu.remapped_rows[key])))
    f.family("engineroom_engine_state", "1 for the engine's current state")
    for engine in snap.engines:
        for state in STATES:
            labels = _labels(
                node=node, engine=engine.id, kind=engine.kind, version=engine.version, state=state
            )
            f.sample("engineroom_engine_state", labels, int(engine.state == state))
    f.family(
        "engineroom_deployment_state",
        "1 for the state of the engine serving this fleet.toml deployment",
    )
    for engine in snap.engines:
        for deployment in engine.deployment_ids:
            for state in STATES:
                labels = _labels(
                    node=node,
                    deployment=deployment,
                    engine=engine.id,
                    kind=engine.kind,
                    state=state,
                )
                f.sample("engineroom_deployment_state", labels, int(engine.state == state))
    for attr, name, help_text in MODEL_FIELDS:
        f.family(name, help_text)
        for engine in snap.engines:
            for model in engine.models:
                value = getattr(model, attr)
                if value is not None:
                    labels = _labels(
                        node=node, engine=engine.id, kind=engine.kind, model=model.name
                    )
                    f.sample(name, labels, value)
    f.family(
        "engineroom_model_requests_waiting_by_reason",
        "requests queued, by why they wait (the engine's reasons)",
    )
    for engine in snap.engines:
        for model in engine.models:
            for reason, count in (model.requests_waiting_by_reason or {}).items():
                labels = _labels(
                    node=node, engine=engine.id, kind=engine.kind, model=model.name, reason=reason
                )
                f.sample("engineroom_model_requests_waiting_by_reason", labels, count)
    f.family(
        "engineroom_engine_api_server_cpu_percent",
        "% of one core used by the engine's API server process over the agent's cycle",
    )
    for engine in snap.engines:
        if engine.api_server_cpu_pct is not None:
            labels = _labels(node=node, engine=engine.id, kind=engine.kind)
            f.sample("engineroom_engine_api_server_cpu_percent", labels, engine.api_server_cpu_pct)
    for series in ("ttft", "itl", "e2e"):
        name = f"engineroom_model_{series}_seconds"
        f.family(name, f"{series} over the agent's window; stat is p50, p95, p99 or mean")
        for engine in snap.engines:
            for model in engine.models:
                pct = getattr(model.latency, f"{series}_s")
                base = dict(node=node, engine=engine.id, kind=engine.kind, model=model.name)
                for stat, attr in LATENCY_STATS:
                    value = getattr(pct, attr)
                    if value is not None:
                        f.sample(name, _labels(**base, stat=stat), value)
    f.family(
        "engineroom_trt_engine_rebuild_required",
        "1 when a TensorRT-LLM engine no longer matches its node (REBUILD REQUIRED), "
        "0 when current; absent when unknown",
    )
    for trt in snap.trt_engines:
        if trt.state in TRT_STATES:
            labels = _labels(node=node, deployment=trt.deployment, model=trt.model)
            f.sample("engineroom_trt_engine_rebuild_required", labels, TRT_STATES[trt.state])
    cpu = snap.cycle.get("cpu_ms")
    if cpu is not None:
        f.family("engineroom_agent_cycle_cpu_seconds", "CPU time of the last snapshot cycle")
        f.sample("engineroom_agent_cycle_cpu_seconds", _labels(node=node), cpu / 1000)
    return "\n".join(f.out) + "\n"
