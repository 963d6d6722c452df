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

from console.core.config import PrometheusSection
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
# The agent's own series (console/agent/exposition.py), by Gpu field.
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
}
AGENT_LATENCY = {
    "engineroom_model_ttft_seconds": "ttft",
    "engineroom_model_itl_seconds": "itl",
    "engineroom_model_e2e_seconds": "e2e",
}
# The agent's latency gauges carry `stat` (p50, p95, p99, mean); older agents `quantile`.
AGENT_QUANTILE = {"0.5": "p50", "0.95": "p95", "0.99": "p99", "mean": "mean"}
AGENT_STATS = ("p50", "p95", "p99", "mean")
QUANTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))
TAG = "er_figure"  # the label our queries add to say which figure a sample is


@dataclass(frozen=True, slots=True)
class Query:
    """One instant query: `family` says how its answer is read (`kind` for engines)."""

    family: (
        str  # up | gpu | gpu_id | agent_gpu | agent_engine | agent_model | gauges | hist | counters
    )
    expr: str
    kind: str | None = None  # the engine kind, for the engine families
    figure: str | None = None  # ttft | itl | e2e, for "hist"
    # What makes it incremental: the labels a sample of `expr` shares with `newest`, an
    # expression giving the newest sample's time per such group (one series scraped
    # with the rest of the family).
    on: str | None = None
    newest: str | None = None

    def since(self, t: float) -> str:
        """Only what was scraped after `t` (unix s): at a 2 s refresh over 30 s scrapes,
        a fifteenth of the fleet. The whole fleet when the family cannot say."""
        if self.on is None or self.newest is None:
            return self.expr
        return f"({self.expr}) and on ({self.on}) ({self.newest} > {t:.3f})"


class Sample(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, str] | None = None  # instant
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


def _tag(expr: str, value: str) -> str:
    return f'label_replace({expr}, "{TAG}", "{value}", "", "")'


def fleet_queries(section: PrometheusSection, engines: dict[str, PromSeries]) -> list[Query]:
    """The refresh's queries: the same list, whatever the fleet's size."""
    node_labels = [*section.labels.node, "instance"]
    nl = ", ".join(node_labels)
    gpu = section.labels.gpu
    window = f"{section.window_s:g}s"
    gpu_on = f"{nl}, {gpu}"
    gpu_newest = f"max by ({gpu_on}) (timestamp(DCGM_FI_DEV_GPU_TEMP))"
    agent_gpu_newest = "max by (node, gpu) (timestamp(engineroom_gpu_temperature_celsius))"
    agent_newest = "max by (node, engine) (timestamp(engineroom_engine_state))"
    queries = [
        Query("up", "up == 0"),  # only the targets Prometheus cannot scrape
        Query(
            "gpu",
            f'max by (__name__, {gpu_on}) ({{__name__=~"{_names(DCGM_READINGS)}"}})',
            on=gpu_on,
            newest=gpu_newest,
        ),
        Query(
            "gpu_id",
            f"max by ({gpu_on}, {DCGM_UUID}, {DCGM_MODEL}, {DCGM_DRIVER}) "
            f'({{__name__=~"DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_GPU_UTIL"}})',
            on=gpu_on,
            newest=gpu_newest,
        ),
        Query(
            "agent_gpu",
            f'{{__name__=~"{_names(AGENT_GPU)}"}}',
            on="node, gpu",
            newest=agent_gpu_newest,
        ),
        Query(
            "agent_engine",
            "engineroom_engine_state == 1",
            on="node, engine",
            newest=agent_newest,
        ),
        Query(
            "agent_model",
            f'{{__name__=~"{_names([*AGENT_MODEL, *AGENT_LATENCY])}"}}',
            on="node, engine",
            newest=agent_newest,
        ),
    ]
    for kind, ps in sorted(engines.items()):
        model = section.labels.model.get(kind, ps.model_label)
        by = f"{nl}, {model}"
        newest = f"max by ({by}) (timestamp({ps.present}))"
        summed = [n for n in (ps.present, ps.running, ps.waiting) if n]
        gauges = f'sum by (__name__, {by}) ({{__name__=~"{_names(summed)}"}})'
        if ps.kv_cache:
            gauges += f" or max by (__name__, {by}) ({ps.kv_cache})"
        queries.append(Query("gauges", gauges, kind, on=by, newest=newest))
        for figure, name in sorted(ps.histograms.items()):
            terms = [
                _tag(
                    f"histogram_quantile({q}, sum by (le, {by}) (rate({name}_bucket[{window}])))",
                    key,
                )
                for key, q in QUANTILES
            ]
            terms.append(_tag(f"sum by ({by}) (increase({name}_count[{window}]))", "count"))
            terms.append(
                _tag(
                    f"sum by ({by}) (rate({name}_sum[{window}])) "
                    f"/ sum by ({by}) (rate({name}_count[{window}]))",
                    "mean",
                )
            )
            queries.append(Query("hist", " or ".join(terms), kind, figure, by, newest))
            queries[-1] = _recorded(queries[-1], section, f"{kind}:{figure}:{window}")
        terms = []
        if ps.requests:
            requests = f'{{__name__=~"{_names(ps.requests)}"}}'
            terms.append(_tag(f"sum by ({by}) (rate({requests}[{window}]))", "requests"))
        if ps.errors:
            errors = " + ".join(f"sum by ({by}) (rate({e}[{window}]))" for e in ps.errors)
            terms.append(_tag(errors, "errors"))
        for figure, (total, count) in sorted(ps.means.items()):
            terms.append(
                _tag(
                    f"sum by ({by}) (rate({total}[{window}])) "
                    f"/ sum by ({by}) (rate({count}[{window}]))",
                    f"mean:{figure}",
                )
            )
            terms.append(_tag(f"sum by ({by}) (increase({count}[{window}]))", f"count:{figure}"))
        if terms:
            queries.append(Query("counters", " or ".join(terms), kind, on=by, newest=newest))
            queries[-1] = _recorded(queries[-1], section, f"{kind}:counters:{window}")
    return queries


RECORDED = "engineroom:"  # the prefix of the recording rules' series


def _recorded(query: Query, section: PrometheusSection, name: str) -> Query:
    """With `recorded`, the query reads the series its recording rule keeps."""
    if not section.recorded:
        return query
    record = RECORDED + name
    newest = f"max by ({query.on}) (timestamp({record}))"
    return Query(query.family, record, query.kind, query.figure, query.on, newest)


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
    """python -m console.collect.promql --recording-rules FLEET: the rules file on stdout."""
    import argparse
    import json

    from console.core.config import ConfigError, load_fleet
    from console.core.plugin import plugin_kinds

    parser = argparse.ArgumentParser(prog="python -m console.collect.promql")
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
