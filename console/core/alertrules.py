"""The one definition of engineroom's alerts: names, severities, thresholds, wording.

The console's alerts (console/collect/views/alerts.py) and the Prometheus alerting rules that
`engineroom rules` writes (console/collect/promrules/alerts.py) both read this module, so a
threshold,
a severity or a comparison changed here changes both; tests/test_rules.py proves that they
fire on the same values.

Each definition says:
- `alert`: the Prometheus alert name;
- `title`: what the console's message starts with (the part before the colon is the
  console's identity of an alert, see alerts.Alert.key);
- `severity`, `description` (one line for the rule's annotations and the docs);
- `limit`: where its threshold comes from in fleet.toml, and `op`, how a value is
  compared with it (`exceeds`);
- `in_rules`: False for the alerts only the console can raise, with why in `note`;
- `raise_after_s`, `clear_after_s`: the hysteresis. The console raises an alert once its
  condition has held `raise_after_s` while it watched (a condition already there when it
  first reads a node is raised at once: it is "active at start", not new), and clears it
  once the condition has been gone `clear_after_s`. The rules get the same two as `for:`
  and `keep_firing_for:`, so a value that wavers at its threshold (a queue that grows,
  pauses, grows) neither flaps in the console nor pages twice;
- `critical_times`: the SLO alerts' scale. Over the limit is `severity` (a warning); over
  `critical_times` times the limit it is critical: 88 times the SLO is not a warning.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from console.core.config.load import Fleet, Model

Severity = Literal["critical", "warning"]
Op = Literal[">", ">="]
_OPS: dict[Op, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge}

# The hysteresis defaults (seconds), documented in docs/prometheus.md. A reading that
# moves (a temperature, a p95 over the agent's 60 s window, a KV cache) must hold for
# HOLD_S before it raises and stay away for CLEAR_S before it clears; an event (an XID,
# ECC errors, an engine down) raises at once and clears after CLEAR_S; a node's own
# status already waits out missed polls (console/collect/sources/collector.py), so it neither
# waits nor lingers.
HOLD_S = 30.0
CLEAR_S = 60.0
# An SLO breach over this many times its limit is critical, not a warning.
SLO_CRITICAL_TIMES = 2.0


@dataclass(frozen=True, slots=True)
class AlertDef:
    alert: str
    title: str
    severity: Severity
    description: str
    op: Op = ">"
    limit: Callable[[Fleet, Model | None], float | None] | None = None  # None: any event
    in_rules: bool = True
    note: str = ""
    raise_after_s: float = 0.0
    clear_after_s: float = 0.0
    critical_times: float | None = None

    def threshold(self, fleet: Fleet, model: Model | None = None) -> float | None:
        """The limit fleet.toml sets (a model's SLO where it is per model); None: none set."""
        return None if self.limit is None else self.limit(fleet, model)

    def exceeds(self, value: float | None, limit: float | None) -> bool:
        """Whether `value` raises this alert at `limit`. Unknown values never do."""
        if value is None or limit is None:
            return False
        return _OPS[self.op](value, limit)

    def severity_at(self, value: float | None, limit: float | None) -> Severity | None:
        """The severity `value` raises at `limit`: None under it (or unknown), critical
        past `critical_times` times it, else this alert's own."""
        if not self.exceeds(value, limit):
            return None
        assert value is not None and limit is not None
        if self.critical_times is not None and value > self.critical_times * limit:
            return "critical"
        return self.severity


def _error_limit(fleet: Fleet, model: Model | None) -> float:
    if model is not None and model.slo.error_rate is not None:
        return model.slo.error_rate
    return fleet.thresholds.error_rate


GPU_TEMP_CRITICAL = AlertDef(
    "EngineroomGpuTemperatureCritical",
    "GPU temperature",
    "critical",
    "GPU temperature at or over thresholds.gpu_temp_crit_c",
    ">=",
    lambda f, m: f.thresholds.gpu_temp_crit_c,
    raise_after_s=HOLD_S,
    clear_after_s=CLEAR_S,
)
GPU_TEMP_WARNING = AlertDef(
    "EngineroomGpuTemperatureWarning",
    "GPU temperature",
    "warning",
    "GPU temperature at or over thresholds.gpu_temp_warn_c (and under the critical one)",
    ">=",
    lambda f, m: f.thresholds.gpu_temp_warn_c,
    raise_after_s=HOLD_S,
    clear_after_s=CLEAR_S,
)
GPU_ECC = AlertDef(
    "EngineroomGpuEccUncorrected",
    "ECC",
    "critical",
    "volatile uncorrected ECC errors on the GPU",
    ">",
    lambda f, m: 0.0,
    clear_after_s=CLEAR_S,
)
GPU_XID = AlertDef(
    "EngineroomGpuXid",
    "XID",
    "critical",
    "the driver reported an XID event on the GPU",
    clear_after_s=CLEAR_S,
)
GPU_ROW_REMAP = AlertDef(
    "EngineroomGpuRowRemapFailure",
    "row remapping",
    "critical",
    "row remapping failed on the GPU: it needs a reset or a replacement",
    clear_after_s=CLEAR_S,
)
REBUILD_REQUIRED = AlertDef(
    "EngineroomRebuildRequired",
    "REBUILD REQUIRED",
    "warning",
    "a TensorRT-LLM engine no longer matches its node's driver, CUDA, TensorRT-LLM or GPU",
)
ENGINE_DOWN = AlertDef(
    "EngineroomEngineDown",
    "engine down",
    "critical",
    "a deployment's engine does not answer (a stopped standby, weight 0, is not an outage)",
    clear_after_s=CLEAR_S,
)
ENGINE_UNHEALTHY = AlertDef(
    "EngineroomEngineUnhealthy",
    "engine unhealthy",
    "critical",
    "a deployment's engine answers but says it is not healthy",
    clear_after_s=CLEAR_S,
)
SLO_TTFT = AlertDef(
    "EngineroomSloTtftP95",
    "SLO TTFT p95",
    "warning",
    "p95 time to first token over the model's SLO (the gateway's p95, else the engine's)",
    ">",
    lambda f, m: None if m is None or m.slo.ttft_p95_ms is None else m.slo.ttft_p95_ms / 1000,
    raise_after_s=HOLD_S,
    clear_after_s=CLEAR_S,
    critical_times=SLO_CRITICAL_TIMES,
)
SLO_ITL = AlertDef(
    "EngineroomSloItlP95",
    "SLO ITL p95",
    "warning",
    "p95 inter-token latency over the model's SLO (the gateway's p95, else the engine's)",
    ">",
    lambda f, m: None if m is None or m.slo.itl_p95_ms is None else m.slo.itl_p95_ms / 1000,
    raise_after_s=HOLD_S,
    clear_after_s=CLEAR_S,
    critical_times=SLO_CRITICAL_TIMES,
)
SLO_E2E = AlertDef(
    "EngineroomSloE2eP95",
    "SLO e2e p95",
    "warning",
    "p95 request latency over the model's SLO (the gateway's p95, else the engine's)",
    ">",
    lambda f, m: None if m is None or m.slo.e2e_p95_ms is None else m.slo.e2e_p95_ms / 1000,
    raise_after_s=HOLD_S,
    clear_after_s=CLEAR_S,
    critical_times=SLO_CRITICAL_TIMES,
)
ERROR_RATE = AlertDef(
    "EngineroomErrorRate",
    "error rate",
    "warning",
    "failed / finished requests over the model's SLO error_rate (else thresholds.error_rate)",
    ">",
    _error_limit,
    raise_after_s=HOLD_S,
    clear_after_s=CLEAR_S,
    critical_times=SLO_CRITICAL_TIMES,
)
KV_CACHE = AlertDef(
    "EngineroomKvCacheNearlyFull",
    "KV cache",
    "warning",
    "KV cache use at or over thresholds.kv_cache_warn",
    ">=",
    lambda f, m: f.thresholds.kv_cache_warn,
    raise_after_s=HOLD_S,
    clear_after_s=CLEAR_S,
)
NODE_DOWN = AlertDef(
    "EngineroomNodeDown",
    "node down",
    "critical",
    "the node's agent does not answer",
    in_rules=False,
    note="Prometheus's own `up == 0` for the scrape job says this",
)
NODE_STALE = AlertDef(
    "EngineroomNodeStale",
    "node stale",
    "warning",
    "the node's newest snapshot is old",
    in_rules=False,
    note="a scrape that fails is `up == 0`; Prometheus has no stale-but-answering state",
)
NVML_DOWN = AlertDef(
    "EngineroomNvmlDown",
    "NVML",
    "warning",
    "NVML stopped answering on a node that has GPUs",
    in_rules=False,
    note="the console compares with the GPUs it saw before; a rule would need the same history",
    clear_after_s=CLEAR_S,
)
QUEUE_GROWING = AlertDef(
    "EngineroomQueueGrowing",
    "queue growing",
    "warning",
    "requests waiting rose for thresholds.queue_growth_polls polls in a row",
    in_rules=False,
    note="counted in the console's polls, which a rule does not see",
    clear_after_s=CLEAR_S,
)

ALL: tuple[AlertDef, ...] = (
    GPU_TEMP_CRITICAL,
    GPU_TEMP_WARNING,
    GPU_ECC,
    GPU_XID,
    GPU_ROW_REMAP,
    REBUILD_REQUIRED,
    ENGINE_DOWN,
    ENGINE_UNHEALTHY,
    SLO_TTFT,
    SLO_ITL,
    SLO_E2E,
    ERROR_RATE,
    KV_CACHE,
    NODE_DOWN,
    NODE_STALE,
    NVML_DOWN,
    QUEUE_GROWING,
)
