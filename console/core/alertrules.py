"""The one definition of engineroom's alerts: names, severities, thresholds, wording.

The console's alerts (console/collect/alerts.py) and the Prometheus alerting rules that
`engineroom rules` writes (console/collect/rules.py) both read this module, so a threshold,
a severity or a comparison changed here changes both; tests/test_rules.py proves that they
fire on the same values.

Each definition says:
- `alert`: the Prometheus alert name;
- `title`: what the console's message starts with (the part before the colon is the
  console's identity of an alert, see alerts.Alert.key);
- `severity`, `description` (one line for the rule's annotations and the docs);
- `limit`: where its threshold comes from in fleet.toml, and `op`, how a value is
  compared with it (`exceeds`);
- `in_rules`: False for the alerts only the console can raise, with why in `note`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from console.core.config import Fleet, Model

Severity = Literal["critical", "warning"]
Op = Literal[">", ">="]
_OPS: dict[Op, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge}


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

    def threshold(self, fleet: Fleet, model: Model | None = None) -> float | None:
        """The limit fleet.toml sets (a model's SLO where it is per model); None: none set."""
        return None if self.limit is None else self.limit(fleet, model)

    def exceeds(self, value: float | None, limit: float | None) -> bool:
        """Whether `value` raises this alert at `limit`. Unknown values never do."""
        if value is None or limit is None:
            return False
        return _OPS[self.op](value, limit)


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
)
GPU_TEMP_WARNING = AlertDef(
    "EngineroomGpuTemperatureWarning",
    "GPU temperature",
    "warning",
    "GPU temperature at or over thresholds.gpu_temp_warn_c (and under the critical one)",
    ">=",
    lambda f, m: f.thresholds.gpu_temp_warn_c,
)
GPU_ECC = AlertDef(
    "EngineroomGpuEccUncorrected",
    "ECC",
    "critical",
    "volatile uncorrected ECC errors on the GPU",
    ">",
    lambda f, m: 0.0,
)
GPU_XID = AlertDef(
    "EngineroomGpuXid", "XID", "critical", "the driver reported an XID event on the GPU"
)
GPU_ROW_REMAP = AlertDef(
    "EngineroomGpuRowRemapFailure",
    "row remapping",
    "critical",
    "row remapping failed on the GPU: it needs a reset or a replacement",
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
)
ENGINE_UNHEALTHY = AlertDef(
    "EngineroomEngineUnhealthy",
    "engine unhealthy",
    "critical",
    "a deployment's engine answers but says it is not healthy",
)
SLO_TTFT = AlertDef(
    "EngineroomSloTtftP95",
    "SLO TTFT p95",
    "warning",
    "p95 time to first token over the model's SLO (the mean where the engine gives no p95)",
    ">",
    lambda f, m: None if m is None or m.slo.ttft_p95_ms is None else m.slo.ttft_p95_ms / 1000,
)
SLO_ITL = AlertDef(
    "EngineroomSloItlP95",
    "SLO ITL p95",
    "warning",
    "p95 inter-token latency over the model's SLO (the mean where the engine gives no p95)",
    ">",
    lambda f, m: None if m is None or m.slo.itl_p95_ms is None else m.slo.itl_p95_ms / 1000,
)
SLO_E2E = AlertDef(
    "EngineroomSloE2eP95",
    "SLO e2e p95",
    "warning",
    "p95 request latency over the model's SLO (the mean where the engine gives no p95)",
    ">",
    lambda f, m: None if m is None or m.slo.e2e_p95_ms is None else m.slo.e2e_p95_ms / 1000,
)
ERROR_RATE = AlertDef(
    "EngineroomErrorRate",
    "error rate",
    "warning",
    "failed / finished requests over the model's SLO error_rate (else thresholds.error_rate)",
    ">",
    _error_limit,
)
KV_CACHE = AlertDef(
    "EngineroomKvCacheNearlyFull",
    "KV cache",
    "warning",
    "KV cache use at or over thresholds.kv_cache_warn",
    ">=",
    lambda f, m: f.thresholds.kv_cache_warn,
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
)
QUEUE_GROWING = AlertDef(
    "EngineroomQueueGrowing",
    "queue growing",
    "warning",
    "requests waiting rose for thresholds.queue_growth_polls polls in a row",
    in_rules=False,
    note="counted in the console's polls, which a rule does not see",
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
