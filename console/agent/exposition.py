"""The agent's /metrics: GPU and normalized engine metrics in Prometheus text.

Engine-neutral names (`engineroom_model_ttft_seconds{quantile="0.95"}`) let one
Prometheus query span vLLM, Triton and trtllm-serve. Unknown values are left out,
never written as 0.
"""

from __future__ import annotations

from console.core.wire import Snapshot


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items() if v is not None)


GPU_FIELDS = (
    ("utilization_pct", "engineroom_gpu_utilization_percent", "GPU utilization"),
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
)
STATES = ("ready", "loading", "unhealthy", "down")


def render(snap: Snapshot) -> str:
    out: list[str] = []
    node = snap.node.name

    def family(name: str, help_text: str, kind: str = "gauge") -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")

    family("engineroom_nvml_up", "1 when NVML answers on this node")
    out.append(f"engineroom_nvml_up{{{_labels(node=node)}}} {int(snap.gpu_status == 'ok')}")
    for attr, name, help_text in GPU_FIELDS:
        family(name, help_text)
        for gpu in snap.gpus:
            value = getattr(gpu, attr)
            if value is not None:
                out.append(
                    f"{name}{{{_labels(node=node, gpu=gpu.index, uuid=gpu.uuid)}}} {float(value):g}"
                )
    family("engineroom_engine_state", "1 for the engine's current state", "gauge")
    for engine in snap.engines:
        for state in STATES:
            labels = _labels(
                node=node, engine=engine.id, kind=engine.kind, version=engine.version, state=state
            )
            out.append(f"engineroom_engine_state{{{labels}}} {int(engine.state == state)}")
    for attr, name, help_text in MODEL_FIELDS:
        family(name, help_text)
        for engine in snap.engines:
            for model in engine.models:
                value = getattr(model, attr)
                if value is not None:
                    labels = _labels(
                        node=node, engine=engine.id, kind=engine.kind, model=model.name
                    )
                    out.append(f"{name}{{{labels}}} {float(value):g}")
    for series in ("ttft", "itl", "e2e"):
        name = f"engineroom_model_{series}_seconds"
        family(name, f"{series} over the agent's window (quantiles, or mean only)")
        for engine in snap.engines:
            for model in engine.models:
                pct = getattr(model.latency, f"{series}_s")
                base = dict(node=node, engine=engine.id, kind=engine.kind, model=model.name)
                for q, value in (
                    ("0.5", pct.p50),
                    ("0.95", pct.p95),
                    ("0.99", pct.p99),
                    ("mean", pct.mean),
                ):
                    if value is not None:
                        out.append(f"{name}{{{_labels(**base, quantile=q)}}} {value:g}")
    cpu = snap.cycle.get("cpu_ms")
    if cpu is not None:
        family("engineroom_agent_cycle_cpu_seconds", "CPU time of the last snapshot cycle")
        out.append(f"engineroom_agent_cycle_cpu_seconds{{{_labels(node=node)}}} {cpu / 1000:g}")
    return "\n".join(out) + "\n"
