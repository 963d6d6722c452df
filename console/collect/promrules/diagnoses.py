"""The diagnoses as Prometheus alerting rules, in `engineroom rules` (issue 30).

Each class of console/core/diagnosis.py that PromQL can tell as the headless finder does
(console/collect/diagnose/diagnoser.py) is one alert, `EngineroomDiagnosis<Class>`, with the class's
severity, thresholds (diagnosis.limit: the model's `[models.diagnoses]`, the fleet's
`[diagnoses]`, the default) and hold (`for:`); labels `diagnosis` (the class's key) and
`severity`; annotations the title in the summary, what it is, what rules it out and the
first move. It reads the series the agent exports (console/agent/api/exposition.py) and, for
the error burst, the gateway's:

- engine_wedged: `engineroom_model_generation_stalled_seconds` at or over wedged_after_s
  with requests running or waiting, on a ready engine;
- triton_stall: `engineroom_model_completion_stalled_seconds` at or over
  triton_stall_after_s with requests pending, on a ready Triton;
- kv_pressure: `engineroom_model_kv_cache_usage_ratio` at or over kv_pressure_usage with
  `engineroom_model_preemption_rate` > 0 or requests waiting for capacity
  (`engineroom_model_requests_waiting_by_reason{reason="capacity"}`), on a ready engine;
  or `engineroom_model_preemption_rate` at or over kv_preemption_storm_rate (a second rule
  of the same name, labelled signal="preemption_storm": a storm whatever the KV gauge
  read);
- error_burst: a deployment's failed / finished at or over error_burst_rate, the gateway's
  where it counted requests for it over its window, else its engine's (the error-rate
  alert's figure), on a ready deployment that fleet.toml gives traffic (weight not 0); an
  engine of no deployment, its own ratio;
- gpu_fault: an XID, uncorrected ECC errors, a row remapping failed or pending;
- stale_trt_engine: a declared deployment's TensorRT-LLM engine no longer matches its node.

A model that sets its own threshold gets a rule matching the names its engines report (its
own, and its deployments' `engine_model`, as the finder maps an engine's figures back to
the declared model); every other name gets the fleet's.

What a rule cannot see: a job under way on an engine (a start, a restart, a drill) is not
in /metrics, so where the finder waits for an engine's job to end, a rule does not. A
figure an engine does not export is absent, and an absent series fires nothing (the
finder says "cannot tell"). The classes PromQL cannot tell at all say why in their
definition (`note`), and the rules file's header lists them.
"""

from __future__ import annotations

from console.collect.promrules.promql import Judged, Rule, none_of, num, one_of
from console.core import diagnosis as d
from console.core.alertrules import AlertDef
from console.core.config.load import Fleet
from console.core.diagnosis import DiagnosisDef

# An engine the agent reports ready (the finder passes over a loading or unhealthy one).
READY = 'on(node, engine) (engineroom_engine_state{state="ready"} == 1)'
ENGINE = "{{ $labels.node }}/{{ $labels.engine }}"  # the finder's subject for an engine
# A figure of the same engine and model as the one it is joined to.
SAME = "on(node, engine, model)"
# Each GPU fault, in the finder's order: the first one present names the alert's `fault`.
GPU_FAULTS = (
    ("XID", "engineroom_gpu_xid_last"),
    ("uncorrected ECC", "engineroom_gpu_ecc_uncorrected_errors > 0"),
    ("row remapping failed", "engineroom_gpu_remapped_rows_failure == 1"),
    ("row remapping pending", "engineroom_gpu_remapped_rows_pending == 1"),
)


def alert_name(defn: DiagnosisDef) -> str:
    """The class's alert, in the alerts' spelling: `engine_wedged` ->
    `EngineroomDiagnosisEngineWedged`."""
    return "EngineroomDiagnosis" + "".join(w.capitalize() for w in defn.name.split("_"))


def _rule(
    defn: DiagnosisDef, expr: str, summary: str, labels: dict[str, str] | None = None
) -> Rule:
    """A rule of `defn`, written as the alerts' are: its name, severity, what it is, and
    its hold as `for:` (a diagnosis clears as soon as its condition goes: no
    keep_firing_for)."""
    alert = AlertDef(
        alert_name(defn), defn.title, defn.severity, defn.summary, raise_after_s=defn.hold_s
    )
    return Rule(
        alert,
        expr,
        summary,
        {"diagnosis": defn.name, **(labels or {})},
        annotations={"rules_out": defn.rules_out, "first_move": d.MOVE_TEXT[defn.moves[0]]},
    )


def _by_model(fleet: Fleet, key: str) -> list[tuple[str, float, dict[str, str]]]:
    """(selector, threshold, labels): one for each model that sets `key` in its
    [models.diagnoses], matching the model name the engine reports (as diagnosis.limit
    looks it up), then one for every other name, at the fleet's value or the default."""
    out, own = [], []
    for m in fleet.models:
        if getattr(m.diagnoses, key) is None:
            continue
        # The names its engines report: its own, and its deployments' engine_model (a
        # Triton deployment's engine reports "ensemble"), as the finder maps them back.
        names = list(dict.fromkeys([m.name, *(x.engine_model for x in m.deployments
                                              if x.engine_model)]))  # fmt: skip
        own += names
        selector = f"{{{one_of('model', names)}}}"
        out.append((selector, d.limit(fleet, m.name, key), {"fleet_model": m.name}))
    rest = f"{{{none_of('model', own)}}}" if own else ""
    return [*out, (rest, d.limit(fleet, None, key), {})]


def engine_wedged(fleet: Fleet) -> list[Rule]:
    defn, out = d.ENGINE_WEDGED, []
    inside = (
        f"{SAME} (engineroom_model_requests_running > 0 "
        f"or {SAME} engineroom_model_requests_waiting > 0)"
    )
    for selector, after, labels in _by_model(fleet, "wedged_after_s"):
        expr = (
            f"engineroom_model_generation_stalled_seconds{selector} >= {num(after)} "
            f"and {inside} and {READY}"
        )
        summary = (
            f"{ENGINE}: {defn.title}: {{{{ $labels.model }}}} generated no token for "
            f"{{{{ $value }}}} s with requests in (wedged_after_s {num(after)})"
        )
        out.append(_rule(defn, expr, summary, labels))
    return out


def triton_stall(fleet: Fleet) -> list[Rule]:
    defn, out = d.TRITON_STALL, []
    queued = f'{SAME} engineroom_model_requests_waiting{{kind="triton"}} > 0'
    for selector, after, labels in _by_model(fleet, "triton_stall_after_s"):
        expr = (
            f"engineroom_model_completion_stalled_seconds{selector} >= {num(after)} "
            f"and {queued} and {READY}"
        )
        summary = (
            f"{ENGINE}: {defn.title}: {{{{ $labels.model }}}} finished no request for "
            f"{{{{ $value }}}} s with requests queued (triton_stall_after_s {num(after)})"
        )
        out.append(_rule(defn, expr, summary, labels))
    return out


def kv_pressure(fleet: Fleet) -> list[Rule]:
    defn, out = d.KV_PRESSURE, []
    pressed = (
        f"{SAME} (engineroom_model_preemption_rate > 0 or {SAME} "
        'engineroom_model_requests_waiting_by_reason{reason="capacity"} > 0)'
    )
    for selector, usage, labels in _by_model(fleet, "kv_pressure_usage"):
        expr = (
            f"engineroom_model_kv_cache_usage_ratio{selector} >= {num(usage)} "
            f"and {pressed} and {READY}"
        )
        summary = (
            f"{ENGINE}: {defn.title}: {{{{ $labels.model }}}} uses {{{{ $value }}}} of its KV "
            "cache with requests preempted or waiting for capacity "
            f"(kv_pressure_usage {num(usage)})"
        )
        out.append(_rule(defn, expr, summary, labels))
    for selector, rate, labels in _by_model(fleet, "kv_preemption_storm_rate"):
        expr = f"engineroom_model_preemption_rate{selector} >= {num(rate)} and {READY}"
        summary = (
            f"{ENGINE}: {defn.title}: {{{{ $labels.model }}}} preempts {{{{ $value }}}} "
            f"requests a second (kv_preemption_storm_rate {num(rate)})"
        )
        # A label of its own: promtool refuses two rules of one name and the same labels.
        out.append(_rule(defn, expr, summary, {**labels, "signal": "preemption_storm"}))
    return out


def error_burst(fleet: Fleet) -> list[Rule]:
    """Each model's deployments, judged as the finder judges them: the gateway's count over
    its own window (its admin snapshot's), else the engine's; then the engines of no
    deployment on their own ratio."""
    defn, out = d.ERROR_BURST, []
    window_s = fleet.gateway.window_s if fleet.gateway else fleet.agent.window_s
    window = f"{max(int(window_s), 1)}s"
    for model in fleet.models:
        live = [dep.id for dep in model.deployments if dep.weight != 0]
        if not live:
            continue
        rate = d.limit(fleet, model.name, "error_burst_rate")
        ready = one_of("deployment", live)
        expr = (
            f"({Judged(model, window).errors(f' >= {num(rate)}')}) and on(deployment) "
            f'(engineroom_deployment_state{{state="ready",{ready}}} == 1)'
        )
        summary = (
            f"{{{{ $labels.deployment }}}}: {defn.title}: {{{{ $value }}}} of requests failed "
            f"at the {{{{ $labels.measured_at }}}} (error_burst_rate {num(rate)})"
        )
        out.append(_rule(defn, expr, summary, {"fleet_model": model.name}))
    for selector, rate, labels in _by_model(fleet, "error_burst_rate"):
        expr = (
            f"engineroom_model_error_ratio{selector} >= {num(rate)} "
            f"unless on(node, engine) engineroom_deployment_state and {READY}"
        )
        summary = (
            f"{ENGINE}: {defn.title}: {{{{ $labels.model }}}}: {{{{ $value }}}} of requests "
            f"failed (error_burst_rate {num(rate)})"
        )
        out.append(_rule(defn, expr, summary, labels))
    return out


def gpu_fault() -> list[Rule]:
    """One alert per GPU, as the finder gives one diagnosis: the first fault present."""
    parts = [f'label_replace({expr}, "fault", "{what}", "", "")' for what, expr in GPU_FAULTS]
    summary = (
        "{{ $labels.node }}/gpu{{ $labels.gpu }}: "
        f"{d.GPU_FAULT.title}: {{{{ $labels.fault }}}} ({{{{ $value }}}})"
    )
    return [_rule(d.GPU_FAULT, " or ignoring(fault) ".join(parts), summary)]


def stale_trt_engine(fleet: Fleet) -> list[Rule]:
    declared = one_of("deployment", [dep.id for m in fleet.models for dep in m.deployments])
    summary = (
        "{{ $labels.node }}/{{ $labels.deployment }}: "
        f"{d.STALE_TRT.title}: it no longer matches its node"
    )
    expr = f"engineroom_trt_engine_rebuild_required{{{declared}}} == 1"
    return [_rule(d.STALE_TRT, expr, summary)]


def diagnosis_rules(fleet: Fleet) -> list[Rule]:
    """The rules of the classes PromQL can tell (diagnosis.DiagnosisDef.in_rules)."""
    return [
        *engine_wedged(fleet),
        *triton_stall(fleet),
        *kv_pressure(fleet),
        *error_burst(fleet),
        *gpu_fault(),
        *stale_trt_engine(fleet),
    ]
