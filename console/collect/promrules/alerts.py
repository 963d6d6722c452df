"""`engineroom rules`: Prometheus alerting rules from fleet.toml.

Every rule is one of the console's alerts (console/core/alertrules.py gives its name,
severity, threshold, comparison and wording), written over the series the agent exports
(console/agent/api/exposition.py). Where a fleet also has dcgm-exporter or an engine's own
histograms, a rule accepts those too, joined with `or`:

- GPU temperature, XID, ECC, row remapping: `engineroom_gpu_*` or `DCGM_FI_DEV_*`;
- SLO TTFT/ITL/e2e p95 and the error rate: per deployment, as the console's verdict
  judges (console/core/slo.py): the gateway's figure where it measured the deployment,
  else the agent's p95 of the deployment's engine (never a mean), else each engine
  plugin's own histograms at the deployments' scrape targets; a warning over the limit,
  critical past critical_times it;
- KV cache: the agent's ratio or the plugin's KV gauge;
- engine down/unhealthy, REBUILD REQUIRED: the agent's series only.

Each rule holds as the console's alert does: `for:` and `keep_firing_for:` are the
definition's raise_after_s and clear_after_s.

The diagnoses PromQL can tell as the headless finder does are rules too, in their own group
(console/collect/promrules/diagnoses.py); the file's header names the others and why.

The output is YAML that `promtool check rules` accepts, in a stable order, so a diff of two
runs shows what changed in the fleet. Names from the fleet are outside text: in a label
matcher they are matched literally (console.collect.prometheus.promql.matcher: regex and PromQL
string
escaping), in a label value no `{{` starts a template, and every scalar is a quoted YAML
string, so one odd name cannot break the file (Prometheus would drop every rule in it).
"""

from __future__ import annotations

import json
import re
import sys
from urllib.parse import urlsplit

from console.collect.prometheus.promql import matcher
from console.collect.promrules.diagnoses import diagnosis_rules
from console.collect.promrules.promql import Judged, Rule, none_of, num, one_of, served_names
from console.core import alertrules as rules
from console.core import diagnosis
from console.core.alertrules import AlertDef, Severity
from console.core.atomicfile import replace_text
from console.core.config.load import Fleet
from console.core.plugin import EnginePlugin, load_plugins

# dcgm-exporter's names for the fields the GPU rules read (its default counters).
DCGM_TEMP = "DCGM_FI_DEV_GPU_TEMP"
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"  # the last XID seen, 0 when none
DCGM_ECC = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # volatile double-bit (uncorrected) errors
DCGM_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"

LATENCY = {
    "ttft": rules.SLO_TTFT,
    "itl": rules.SLO_ITL,
    "e2e": rules.SLO_E2E,
}


def gpu_rules(fleet: Fleet) -> list[Rule]:
    crit = rules.GPU_TEMP_CRITICAL.threshold(fleet)
    warn = rules.GPU_TEMP_WARNING.threshold(fleet)
    assert crit is not None and warn is not None  # both always set (config defaults)
    where = "{{ $labels.node }}{{ $labels.Hostname }} GPU {{ $labels.gpu }}"
    ecc = rules.GPU_ECC.threshold(fleet) or 0.0
    return [
        Rule(
            rules.GPU_TEMP_CRITICAL,
            f"engineroom_gpu_temperature_celsius >= {num(crit)} or {DCGM_TEMP} >= {num(crit)}",
            f"{where}: {rules.GPU_TEMP_CRITICAL.title}: {{{{ $value }}}} C "
            f"(critical at {num(crit)})",
        ),
        Rule(
            rules.GPU_TEMP_WARNING,
            f"(engineroom_gpu_temperature_celsius >= {num(warn)} < {num(crit)})"
            f" or ({DCGM_TEMP} >= {num(warn)} < {num(crit)})",
            f"{where}: {rules.GPU_TEMP_WARNING.title}: {{{{ $value }}}} C (warning at {num(warn)})",
        ),
        Rule(
            rules.GPU_ECC,
            f"engineroom_gpu_ecc_uncorrected_errors > {num(ecc)} or {DCGM_ECC} > {num(ecc)}",
            f"{where}: {rules.GPU_ECC.title}: {{{{ $value }}}} volatile uncorrected errors",
        ),
        Rule(
            rules.GPU_XID,
            f"engineroom_gpu_xid_last > 0 or {DCGM_XID} > 0",
            f"{where}: {rules.GPU_XID.title}: {{{{ $value }}}}",
        ),
        Rule(
            rules.GPU_ROW_REMAP,
            f"engineroom_gpu_remapped_rows_failure == 1 or {DCGM_ROW_REMAP_FAILURE} > 0",
            f"{where}: {rules.GPU_ROW_REMAP.title}: failure",
        ),
    ]


def engine_rules(fleet: Fleet) -> list[Rule]:
    # A declared standby (weight 0) that is down is waiting to be started, not an outage.
    standby = [d.id for m in fleet.models for d in m.deployments if d.weight == 0]
    spare = f",{none_of('deployment', standby)}" if standby else ""
    where = "{{ $labels.node }}/{{ $labels.deployment }} ({{ $labels.engine }})"
    return [
        Rule(
            rules.ENGINE_DOWN,
            f'engineroom_deployment_state{{state="down"{spare}}} == 1',
            f"{where}: {rules.ENGINE_DOWN.title}",
        ),
        Rule(
            rules.ENGINE_UNHEALTHY,
            'engineroom_deployment_state{state="unhealthy"} == 1',
            f"{where}: {rules.ENGINE_UNHEALTHY.title}",
        ),
        Rule(
            rules.REBUILD_REQUIRED,
            "engineroom_trt_engine_rebuild_required == 1",
            "{{ $labels.node }}/{{ $labels.deployment }}: "
            f"{rules.REBUILD_REQUIRED.title}: the engine no longer matches its node",
        ),
    ]


def _instance(endpoint: str) -> str | None:
    """The `instance` label Prometheus gives a scrape of `endpoint` (its host:port)."""
    parts = urlsplit(endpoint)
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


def _bands(defn: AlertDef, limit: float) -> list[tuple[Severity, str]]:
    """(severity, comparison) for each band of a breach: over the limit a warning, and past
    critical_times the limit critical (the console's verdict, console/core/slo.py)."""
    if defn.critical_times is None:
        return [(defn.severity, f" > {num(limit)}")]
    top = num(defn.critical_times * limit)
    return [(defn.severity, f" > {num(limit)} <= {top}"), ("critical", f" > {top}")]


def _native(
    judged: Judged,
    series: str,
    band: str,
    plugins: dict[str, EnginePlugin],
) -> list[str]:
    """Each engine plugin's own histogram (vLLM's, Triton's), for a fleet whose
    Prometheus scrapes the engines and no agent or gateway: matched by the scrape target
    of each of this model's deployments of that kind (`instance`), never by a model name
    alone; read only where neither the agents nor the gateway report the model."""
    model = judged.model
    names = one_of("model", served_names(model))
    gateway = matcher("model", [model.name])
    absent = (
        f"unless on() (count(engineroom_model_{series}_seconds{{{names}}}) "
        f"or count(engineroom_gateway_{series}_seconds_bucket{{{gateway}}}))"
    )
    out = []
    for kind in sorted({d.engine for d in model.deployments}):
        prom = getattr(plugins.get(kind), "prometheus", None)
        name = prom.histograms.get(series) if prom is not None else None
        mine = [d for d in model.deployments if d.engine == kind]
        targets = [t for d in mine if (t := _instance(d.metrics_endpoint or d.endpoint))]
        if prom is None or name is None or not targets:
            continue
        served = [model.name, *(d.engine_model for d in mine if d.engine_model)]
        where = f"{one_of(prom.model_label, served)},{one_of('instance', targets)}"
        scale = f" * {num(prom.histogram_scale)}" if prom.histogram_scale != 1 else ""
        quantile = (
            f"histogram_quantile(0.95, sum by (le, instance, {prom.model_label}) "
            f"(rate({name}_bucket{{{where}}}[{judged.window}])))"
        )
        out.append(
            f'(label_replace({quantile}{scale}{band}, "measured_at", "engine", "", "") {absent})'
        )
    return out


def model_rules(fleet: Fleet, plugins: dict[str, EnginePlugin]) -> list[Rule]:
    """Each model's SLO, judged per deployment as the console's verdict judges it: the
    gateway's p95 where the gateway measured the deployment, else the engine's p95 (a mean
    is never a p95: no rule reads one); a warning over the limit, critical past
    critical_times it."""
    out: list[Rule] = []
    window = f"{max(int(fleet.agent.window_s), 1)}s"
    where = "{{ $labels.deployment }}{{ $labels.instance }}"
    for model in fleet.models:
        if not model.deployments:
            continue
        judged = Judged(model, window)
        names = one_of("model", served_names(model))
        labels = {"fleet_model": model.name}
        for series, defn in LATENCY.items():
            limit = defn.threshold(fleet, model)
            if limit is None:
                continue
            engine = f'engineroom_model_{series}_seconds{{stat="p95",{names}}}'
            for severity, band in _bands(defn, limit):
                parts = [
                    judged.either(
                        judged.gateway(series, band),
                        engine + judged.deployments + band,
                        judged.gateway(series),
                    ),
                    *_native(judged, series, band, plugins),
                ]
                summary = (
                    f"{where}: {defn.title}: {{{{ $value }}}} s at the "
                    f"{{{{ $labels.measured_at }}}} (over {num(limit)} s)"
                )
                out.append(Rule(defn, " or ".join(parts), summary, labels, severity))
        errors = rules.ERROR_RATE.threshold(fleet, model)
        assert errors is not None  # the fleet's default where the model sets none
        for severity, band in _bands(rules.ERROR_RATE, errors):
            expr = judged.errors(band)
            summary = (
                f"{where}: {rules.ERROR_RATE.title}: {{{{ $value }}}} at the "
                f"{{{{ $labels.measured_at }}}} (over {num(errors)})"
            )
            out.append(Rule(rules.ERROR_RATE, expr, summary, labels, severity))
    # An engine that serves no declared deployment gets the fleet's default error rate,
    # as in the console (its rows are the undeclared ones).
    default = rules.ERROR_RATE.threshold(fleet, None)
    assert default is not None
    other = "engineroom_model_error_ratio unless on(node, engine) engineroom_deployment_state"
    plain = "{{ $labels.node }} {{ $labels.engine }} {{ $labels.model }}"
    for severity, band in _bands(rules.ERROR_RATE, default):
        out.append(
            Rule(
                rules.ERROR_RATE,
                f"({other}){band}",
                f"{plain}: {rules.ERROR_RATE.title}: {{{{ $value }}}} (over {num(default)})",
                severity=severity,
            )
        )
    kv = rules.KV_CACHE.threshold(fleet)
    assert kv is not None
    parts = [f"engineroom_model_kv_cache_usage_ratio >= {num(kv)}"]
    for kind in sorted(plugins):
        prom = getattr(plugins[kind], "prometheus", None)
        if prom is not None and prom.kv_cache:
            parts.append(f"{prom.kv_cache} >= {num(kv)}")
    where = "{{ $labels.node }}{{ $labels.instance }} {{ $labels.model }}{{ $labels.model_name }}"
    out.append(
        Rule(
            rules.KV_CACHE,
            " or ".join(parts),
            f"{where}: {rules.KV_CACHE.title}: {{{{ $value }}}} used (warning at {num(kv)})",
        )
    )
    return out


def build(fleet: Fleet, plugins: dict[str, EnginePlugin] | None = None) -> dict[str, list[Rule]]:
    """The rule groups for `fleet`: gpus, engines, models, diagnoses."""
    plugins = load_plugins() if plugins is None else plugins
    return {
        "engineroom-gpus": gpu_rules(fleet),
        "engineroom-engines": engine_rules(fleet),
        "engineroom-models": model_rules(fleet, plugins),
        "engineroom-diagnoses": diagnosis_rules(fleet),
    }


def _q(text: str) -> str:
    """A YAML scalar in double quotes (JSON's escaping is YAML's), on one line: JSON leaves
    DEL, C1 controls and U+2028/2029 as they are, and YAML 1.1 breaks lines at the last."""
    return _UNPRINTABLE.sub(_escape, json.dumps(text, ensure_ascii=False))


_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def _escape(found: re.Match[str]) -> str:
    c = found.group()
    if c.isprintable():
        return c
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def _literal(value: str) -> str:
    """A label value as Prometheus' template for it: each `{` written as the template
    action {{"{"}}, so a name holding `{{` prints as it is instead of starting one."""
    return value.replace("{", '{{"{"}}')


def render(fleet: Fleet, plugins: dict[str, EnginePlugin] | None = None) -> str:
    """The rules file's text (YAML)."""
    lines = [
        f"# Alerting rules for fleet {fleet.fleet.name!r}, written by `engineroom rules`",
        f"# from {fleet.source}. Regenerate after editing the fleet; do not edit by hand.",
        "# Thresholds and wording: console/core/alertrules.py, shared with the console;",
        "# the diagnoses': console/core/diagnosis.py. Diagnoses with no rule, and why:",
        *(f"#   {c.name}: {c.note}" for c in diagnosis.ALL if not c.in_rules),
        "groups:",
    ]
    for group, group_rules in build(fleet, plugins).items():
        lines += [f"  - name: {_q(group)}", "    rules:"]
        for rule in group_rules:
            severity = rule.severity or rule.defn.severity
            labels = {"severity": severity, "fleet": fleet.fleet.name, **rule.labels}
            labels = {k: _literal(v) for k, v in labels.items()}
            lines += [
                f"      - alert: {rule.defn.alert}",
                f"        expr: {_q(rule.expr)}",
                *_holds(rule.defn),
                "        labels:",
                *(f"          {k}: {_q(v)}" for k, v in labels.items()),
                "        annotations:",
                f"          summary: {_q(rule.summary)}",
                f"          description: {_q(rule.defn.description)}",
                *(f"          {k}: {_q(v)}" for k, v in rule.annotations.items()),
            ]
    return "\n".join(lines) + "\n"


def _holds(defn: AlertDef) -> list[str]:
    """The alert's hysteresis (console/core/alertrules.py) as the rule's `for:` and
    `keep_firing_for:` (Prometheus 2.42 and later): the console's holds, the same."""
    out = []
    if defn.raise_after_s > 0:
        out.append(f"        for: {_duration(defn.raise_after_s)}")
    if defn.clear_after_s > 0:
        out.append(f"        keep_firing_for: {_duration(defn.clear_after_s)}")
    return out


def _duration(seconds: float) -> str:
    return f"{seconds:g}s" if seconds % 60 else f"{seconds / 60:g}m"


def run_rules(fleet: Fleet, out: str | None) -> int:
    """`engineroom rules`: the rules on stdout, or written to `out` (replaced whole)."""
    text = render(fleet)
    if out is None:
        sys.stdout.write(text)
        return 0
    path = out
    try:
        # Whole: a Prometheus reloading meanwhile reads the old file or the new. A symbolic
        # link (into a rules repository, say) stays one: its target gets the text.
        replace_text(path, text)
    except OSError as exc:
        print(f"engineroom rules: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"engineroom rules: wrote {path} ({text.count('- alert:')} rules)", file=sys.stderr)
    return 0
