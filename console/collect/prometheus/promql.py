"""The queries a Prometheus-read console runs, and the answers' shape.

A fixed, small set of instant queries, one per metric family across the whole fleet, so
a refresh costs the same number of HTTP calls at 10 nodes and at 10,000. Engine series
names come from each plugin's `PromSeries` (the engine specifics stay in plugins/); the
GPU names are dcgm-exporter's and the agent's own (`engineroom_gpu_*`).

Every query groups by the labels that can name a node (the mapping's, then `instance`),
so what comes back is only what the screens show, not every label an exporter adds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import msgspec

from console.core.config.load import PrometheusSection
from console.core.plugin import PromSeries

# dcgm-exporter's fields (its default counters file), by what the console calls them.
DCGM_READINGS = {
    "DCGM_FI_DEV_GPU_UTIL": "util",  # %
    "DCGM_FI_DEV_FB_USED": "fb_used",  # MiB
    "DCGM_FI_DEV_FB_FREE": "fb_free",  # MiB
    "DCGM_FI_DEV_FB_RESERVED": "fb_reserved",  # MiB, newer exporters
    "DCGM_FI_DEV_GPU_TEMP": "temp",  # C
    "DCGM_FI_DEV_POWER_USAGE": "power",  # W
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock",  # MHz
    "DCGM_FI_DEV_XID_ERRORS": "xid",  # the last XID seen (0: none)
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc",  # volatile double-bit (uncorrected) errors
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle",  # bitmask (older name)
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle",  # bitmask
}
DCGM_UUID, DCGM_MODEL, DCGM_DRIVER = "UUID", "modelName", "DCGM_FI_DRIVER_VERSION"
# The agent's own series (console/agent/api/exposition.py), by Gpu field.
AGENT_GPU = {
    "engineroom_gpu_utilization_percent": "utilization_pct",
    "engineroom_gpu_memory_used_bytes": "memory_used_bytes",
    "engineroom_gpu_memory_total_bytes": "memory_total_bytes",
    "engineroom_gpu_temperature_celsius": "temperature_c",
    "engineroom_gpu_power_watts": "power_w",
    "engineroom_gpu_power_limit_watts": "power_limit_w",
    "engineroom_gpu_sm_clock_mhz": "sm_clock_mhz",
    "engineroom_gpu_ecc_uncorrected_errors": "ecc_uncorrected",
}
AGENT_MODEL = {
    "engineroom_model_requests_running": "requests_running",
    "engineroom_model_requests_waiting": "requests_waiting",
    "engineroom_model_kv_cache_usage_ratio": "kv_cache_usage",
    "engineroom_model_request_rate": "request_rate",
    "engineroom_model_error_ratio": "error_rate",
    "engineroom_model_generation_tokens_rate": "generation_tokens_rate",
    "engineroom_model_preemption_rate": "preemption_rate",
    "engineroom_model_prefix_cache_hit_ratio": "prefix_cache_hit_rate",
    "engineroom_model_generation_stalled_seconds": "generation_stalled_s",
    "engineroom_model_completion_stalled_seconds": "completion_stalled_s",
}
# Read with the model figures (one query): waiting requests by `reason`, and the engine's
# API server CPU (no `model` label).
AGENT_WAITING_BY_REASON = "engineroom_model_requests_waiting_by_reason"
AGENT_API_SERVER_CPU = "engineroom_engine_api_server_cpu_percent"
AGENT_LATENCY = {
    "engineroom_model_ttft_seconds": "ttft",
    "engineroom_model_itl_seconds": "itl",
    "engineroom_model_e2e_seconds": "e2e",
}
AGENT_MODEL_SERIES = (*AGENT_MODEL, *AGENT_LATENCY, AGENT_WAITING_BY_REASON, AGENT_API_SERVER_CPU)
# The agent's latency gauges carry `stat` (p50, p95, p99, mean); older agents `quantile`.
AGENT_QUANTILE = {"0.5": "p50", "0.95": "p95", "0.99": "p99", "mean": "mean"}
AGENT_STATS = ("p50", "p95", "p99", "mean")
QUANTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))
TAG = "er_figure"  # the label our queries add to say which figure a sample is
WAITING = "waiting:"  # a model reading's key for waiting requests by reason, then the reason
API_SERVER_CPU = "api_server_cpu"  # the counters' tag of the engine's API server CPU


SLICE = "<slice>"  # where a query's template takes a slice's label matcher


@dataclass(frozen=True, slots=True)
class Query:
    """One instant query: `family` says how its answer is read (`kind` for engines)."""

    family: (
        str  # up | gpu | gpu_id | agent_gpu | agent_engine | agent_model | gauges | hist | counters
    )
    expr: str  # the whole fleet
    kind: str | None = None  # the engine kind, for the engine families
    figure: str | None = None  # ttft | itl | e2e, for "hist"
    # `expr` with a SLICE in every selector (None: never sliced). A slice puts a label
    # matcher there, so Prometheus reads only the series it selects; a filter on the
    # answer (`and on (...) timestamp(...) > t`) would make it read all, then drop most.
    template: str | None = None

    @property
    def name(self) -> str:
        """What the header calls it: "gpu", "vllm hist ttft", "triton counters"."""
        return " ".join(part for part in (self.kind, self.family, self.figure) if part)

    def sliced(self, matcher: str) -> str:
        """Only the series `matcher` (`label=~"a|b"`) selects, in every selector."""
        assert self.template is not None, f"the {self.family} query is never sliced"
        return self.template.replace(SLICE, matcher)


def _sliceable(
    family: str, template: str, kind: str | None = None, figure: str | None = None
) -> Query:
    whole = template.replace("{" + SLICE + "}", "").replace("," + SLICE, "")
    return Query(family, whole, kind, figure, template)


def _sel(selector: str) -> str:
    """A series selector (`name`, `name{a="b"}` or `{__name__=~"..."}`) with a SLICE."""
    if selector.endswith("}"):
        return f"{selector[:-1]},{SLICE}}}"
    return f"{selector}{{{SLICE}}}"


class Point(msgspec.Struct, array_like=True, gc=False):
    """An instant query's `[time, "value"]`."""

    time: float
    text: str


# Neither is tracked by the garbage collector (msgspec's gc=False: they hold no cycle). A
# sliced refresh at 10,000 nodes decodes 94,000 samples; as a struct and a tuple each, the
# young generation filled with 190,000 objects a refresh, each collection walking them.
class Sample(msgspec.Struct, gc=False):
    metric: dict[str, str]
    value: Point | None = None  # instant
    values: list[tuple[float, str]] | None = None  # range


class Data(msgspec.Struct):
    resultType: str  # Prometheus' spelling
    result: list[Sample] = []
    stats: dict[str, object] | None = None


class Answer(msgspec.Struct):
    status: str
    data: Data | None = None
    errorType: str | None = None
    error: str | None = None
    warnings: list[str] = []


ANSWER = msgspec.json.Decoder(Answer)


def _names(names: object) -> str:
    return "|".join(sorted(set(names)))  # type: ignore[call-overload]


def _any(names: object) -> str:
    return f'{{__name__=~"{_names(names)}"}}'


def _tag(expr: str, value: str) -> str:
    return f'label_replace({expr}, "{TAG}", "{value}", "", "")'


def fleet_queries(section: PrometheusSection, engines: dict[str, PromSeries]) -> list[Query]:
    """The refresh's queries: the same list, whatever the fleet's size."""
    node_labels = [*section.labels.node, "instance"]
    nl = ", ".join(node_labels)
    gpu = section.labels.gpu
    window = f"{section.window_s:g}s"
    gpu_on = f"{nl}, {gpu}"
    queries = [
        Query("up", "up == 0"),  # only the targets Prometheus cannot scrape
        _sliceable(
            "gpu",
            f"max by (__name__, {gpu_on}) ({_sel(_any(DCGM_READINGS))})",
        ),
        _sliceable(
            "gpu_id",
            f"max by ({gpu_on}, {DCGM_UUID}, {DCGM_MODEL}, {DCGM_DRIVER}) "
            f"({_sel(_any(['DCGM_FI_DEV_GPU_TEMP', 'DCGM_FI_DEV_GPU_UTIL']))})",
        ),
        _sliceable("agent_gpu", _sel(_any(AGENT_GPU))),
        _sliceable("agent_engine", f"{_sel('engineroom_engine_state')} == 1"),
        _sliceable("agent_model", _sel(_any(AGENT_MODEL_SERIES))),
    ]
    for kind, ps in sorted(engines.items()):
        model = section.labels.model.get(kind, ps.model_label)
        by = f"{nl}, {model}"
        summed = [n for n in (ps.present, ps.running, ps.waiting) if n]
        gauges = f"sum by (__name__, {by}) ({_sel(_any(summed))})"
        if ps.kv_cache:
            gauges += f" or max by (__name__, {by}) ({_sel(ps.kv_cache)})"
        if ps.waiting_by_reason:
            series, reason = ps.waiting_by_reason
            gauges += f" or sum by (__name__, {by}, {reason}) ({_sel(series)})"
        queries.append(_sliceable("gauges", gauges, kind))
        for figure, name in sorted(ps.histograms.items()):
            bucket, count, total = (_sel(f"{name}_{s}") for s in ("bucket", "count", "sum"))
            terms = [
                _tag(
                    f"histogram_quantile({q}, sum by (le, {by}) (rate({bucket}[{window}])))",
                    key,
                )
                for key, q in QUANTILES
            ]
            terms.append(_tag(f"sum by ({by}) (increase({count}[{window}]))", "count"))
            terms.append(
                _tag(
                    f"sum by ({by}) (rate({total}[{window}])) "
                    f"/ sum by ({by}) (rate({count}[{window}]))",
                    "mean",
                )
            )
            queries.append(_sliceable("hist", " or ".join(terms), kind, figure))
            queries[-1] = _recorded(queries[-1], section, f"{kind}:{figure}:{window}")
        terms = []
        if ps.requests:
            requests = _sel(_any(ps.requests))
            terms.append(_tag(f"sum by ({by}) (rate({requests}[{window}]))", "requests"))
        if ps.errors:
            errors = " + ".join(f"sum by ({by}) (rate({_sel(e)}[{window}]))" for e in ps.errors)
            terms.append(_tag(errors, "errors"))
        for tag, counter in (
            ("generation_tokens_rate", ps.generation_tokens),  # tagged as the field
            ("preemption_rate", ps.preemptions),
        ):
            if counter:
                terms.append(_tag(f"sum by ({by}) (rate({_sel(counter)}[{window}]))", tag))
        if ps.prefix_cache:
            hits, asked = (_sel(c) for c in ps.prefix_cache)
            # Queries that did not move make 0/0, NaN: read as unknown, never 0.
            terms.append(
                _tag(
                    f"sum by ({by}) (rate({hits}[{window}])) "
                    f"/ sum by ({by}) (rate({asked}[{window}]))",
                    "prefix_cache_hit_rate",
                )
            )
        if ps.process_cpu:
            # The engine's own scrape target only: every exporter has a process_cpu_seconds.
            terms.append(
                _tag(
                    f"100 * sum by ({nl}) (rate({_sel(ps.process_cpu)}[{window}])) "
                    f"and on ({nl}) group by ({nl}) ({_sel(ps.present)})",
                    API_SERVER_CPU,
                )
            )
        for figure, (total, count) in sorted(ps.means.items()):
            total, count = _sel(total), _sel(count)
            terms.append(
                _tag(
                    f"sum by ({by}) (rate({total}[{window}])) "
                    f"/ sum by ({by}) (rate({count}[{window}]))",
                    f"mean:{figure}",
                )
            )
            terms.append(_tag(f"sum by ({by}) (increase({count}[{window}]))", f"count:{figure}"))
        if terms:
            queries.append(_sliceable("counters", " or ".join(terms), kind))
            queries[-1] = _recorded(queries[-1], section, f"{kind}:counters:{window}")
    return queries


RECORDED = "engineroom:"  # the prefix of the recording rules' series


def _recorded(query: Query, section: PrometheusSection, name: str) -> Query:
    """With `recorded`, the query reads the series its recording rule keeps."""
    if not section.recorded:
        return query
    return _sliceable(query.family, _sel(RECORDED + name), query.kind, query.figure)


def recording_rules(
    section: PrometheusSection, engines: dict[str, PromSeries], interval_s: float = 30.0
) -> dict[str, object]:
    """A Prometheus rules file (as JSON, which is YAML) that keeps each latency and rate
    figure the console reads, evaluated once an interval by Prometheus itself instead of
    once a refresh by every console."""
    plain = section.model_copy(update={"recorded": False})
    recorded = section.model_copy(update={"recorded": True})
    rules = [
        {"record": r.expr, "expr": q.expr}
        for q, r in zip(
            fleet_queries(plain, engines), fleet_queries(recorded, engines), strict=True
        )
        if r.expr.startswith(RECORDED)
    ]
    group = {"name": "engineroom-console", "interval": f"{interval_s:g}s", "rules": rules}
    return {"groups": [group]}


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def matcher(label: str, values: list[str]) -> str:
    """`label=~"a|b|..."`: the series whose `label` is one of `values`, exactly (Prometheus
    looks a set of literals up in its index rather than testing each value)."""
    literal = ("".join("\\" + c if c in RE2_SPECIAL else c for c in v) for v in values)
    return f"{label}=~{_quoted('|'.join(literal))}"


def history_queries(
    section: PrometheusSection, engines: dict[str, PromSeries], model: str
) -> list[tuple[str, str, str]]:
    """(kind, figure, expr): what Model detail plots for one model, per deployment, for a
    range query: the TTFT and ITL p95 where a histogram gives one, else the windowed mean.
    One model's series only, so the answer stays small at any fleet size."""
    nl = ", ".join([*section.labels.node, "instance"])
    window = f"{section.window_s:g}s"
    out = []
    for kind, ps in sorted(engines.items()):
        label = section.labels.model.get(kind, ps.model_label)
        by = f"{nl}, {label}"
        only = f"{{{label}={_quoted(model)}}}"
        for figure in ("ttft", "itl"):
            if figure in ps.histograms:
                name = ps.histograms[figure]
                expr = (
                    f"histogram_quantile(0.95, sum by (le, {by}) "
                    f"(rate({name}_bucket{only}[{window}])))"
                )
                out.append((kind, figure, expr))
            elif figure in ps.means:
                total, count = ps.means[figure]
                expr = (
                    f"sum by ({by}) (rate({total}{only}[{window}])) "
                    f"/ sum by ({by}) (rate({count}{only}[{window}]))"
                )
                out.append((kind, figure, expr))
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m console.collect.prometheus.promql --recording-rules FLEET: the rules file on
    stdout."""
    import argparse
    import json

    from console.core.config.load import ConfigError, load_fleet
    from console.core.plugin import plugin_kinds

    parser = argparse.ArgumentParser(prog="python -m console.collect.prometheus.promql")
    parser.add_argument("--recording-rules", metavar="FLEET", required=True)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds")
    args = parser.parse_args(argv)
    try:
        fleet = load_fleet(args.recording_rules)
    except ConfigError as exc:
        print(f"engineroom: {exc}", file=sys.stderr)
        return 3
    if fleet.prometheus is None:
        print(f"engineroom: {args.recording_rules}: no [prometheus] section", file=sys.stderr)
        return 3
    engines = {k: c.prometheus for k, c in plugin_kinds().items() if c.prometheus}
    print(json.dumps(recording_rules(fleet.prometheus, engines, args.interval), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
