"""bench.prom_scale --probe: no console; the Prometheus' and the exporter's CPU with no
query at all, then each of the console's queries alone (and candidates for a cheaper
refresh), and the report written from them (docs/evidence/bench-prom-queries.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from bench.prom_console import REFRESH_S
from bench.prom_exporter import DEPLOYMENTS_PER_NODE, GPUS_PER_NODE

if TYPE_CHECKING:
    from tests.prometheus_proc import PrometheusProc

PROBE_EVIDENCE = Path(__file__).resolve().parents[1] / "docs/evidence/bench-prom-queries.txt"
PROBE_RUNS = 3


def probe(
    prom: PrometheusProc, exporter: subprocess.Popen[str], args: argparse.Namespace
) -> dict[str, object]:
    """The ingest floor, then each query alone (see the module's docstring)."""
    import httpx

    from console.collect.prometheus.promql import (
        ANSWER,
        DCGM_READINGS,
        _tag,
        fleet_queries,
        matcher,
    )
    from console.collect.prometheus.source import SLICE_CYCLE_S
    from console.core.config.load import parse_fleet
    from console.core.plugin import plugin_kinds

    procs = {
        "prometheus": psutil.Process(prom.process.pid),
        "exporter": psutil.Process(exporter.pid),
    }
    before = {k: p.cpu_times() for k, p in procs.items()}
    time.sleep(args.idle)
    idle = {
        f"{k}_idle_cpu_pct": round(
            100
            * ((p.cpu_times().user + p.cpu_times().system) - (before[k].user + before[k].system))
            / args.idle,
            1,
        )
        for k, p in procs.items()
    }
    parsed = parse_fleet(
        f'[fleet]\nname = "x"\n[prometheus]\nurl = "{prom.url}"\nwindow_s = {args.window}\n'
        f"recorded = {str(args.recorded).lower()}\n"
    )
    assert parsed.prometheus is not None
    engines = {k: c.prometheus for k, c in plugin_kinds().items() if c.prometheus}
    fleet = fleet_queries(parsed.prometheus, engines)
    gpu = next(q for q in fleet if q.family == "gpu")
    ttft_q = next(q for q in fleet if q.figure == "ttft" and q.kind == "vllm")
    slices = max(2, round(SLICE_CYCLE_S / REFRESH_S))  # as PromSource cuts them
    picked = range(0, args.nodes, slices)  # the first slice: every `slices`-th, sorted
    hosts = [f"node-{n:05d}" for n in picked]
    ips = sorted(
        f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}:{8000 + d}"
        for n in range(args.nodes)
        for d in range(DEPLOYMENTS_PER_NODE)
    )[::slices]
    queries = [
        (f"{q.family}{':' + q.kind if q.kind else ''}{':' + q.figure if q.figure else ''}", q.expr)
        for q in fleet
    ]
    dcgm = "|".join(sorted({n for n in DCGM_READINGS}))
    per_node = ", ".join([*parsed.prometheus.labels.node, "instance"])  # as fleet_queries
    on = f"{per_node}, {parsed.prometheus.labels.gpu}"
    window = f"{args.window}s"
    maxed = "DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_XID_ERRORS"
    summed = "DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE|DCGM_FI_DEV_POWER_USAGE|DCGM_FI_DEV_GPU_UTIL"
    ttft = f"engineroom:vllm:ttft:{window}" if args.recorded else None
    candidates: list[tuple[str, str | Callable[[], str]]] = [
        # built as it is sent, as a console's refresh 2 s after the last one would
        # one slice as the console reads it between whole reads (node names as the exporter's)
        (f"cand: gpu, 1 slice of {slices} (Hostname)", gpu.sliced(matcher("Hostname", hosts))),
        (f"cand: ttft, 1 slice of {slices} (instance)", ttft_q.sliced(matcher("instance", ips))),
        ("cand: gpu, one index of 8", f'max by (__name__, {on}) ({{__name__=~"{dcgm}", gpu="0"}})'),
        (
            "cand: gpu per node (max, sum)",  # `or` matches without __name__: tag each side
            _tag(f'max by (__name__, {per_node}) ({{__name__=~"{maxed}"}})', "max")
            + " or "
            + _tag(f'sum by (__name__, {per_node}) ({{__name__=~"{summed}"}})', "sum"),
        ),
    ]
    if ttft:
        candidates.append(("cand: ttft p95 only (recorded)", f'{ttft}{{er_figure="p95"}}'))
    rows = []
    with httpx.Client(timeout=300) as http:
        for name, expr_or_fn in queries + candidates:
            runs = []
            for _ in range(PROBE_RUNS):
                expr = expr_or_fn if isinstance(expr_or_fn, str) else expr_or_fn()
                t0 = time.monotonic()
                resp = http.post(f"{prom.url}/api/v1/query", data={"query": expr, "stats": "all"})
                wall = time.monotonic() - t0
                t1 = time.perf_counter()
                answer = ANSWER.decode(resp.content)
                decode = time.perf_counter() - t1
                if answer.status != "success" or answer.data is None:
                    raise RuntimeError(f"{name}: {answer.error}")
                stats = answer.data.stats or {}
                timings = stats.get("timings") if isinstance(stats, dict) else None
                if not isinstance(timings, dict):
                    timings = {}
                took = timings.get("execTotalTime")  # None: Prometheus did not say
                runs.append(
                    (
                        None if took is None else float(took),
                        wall,
                        decode,
                        len(answer.data.result),
                        len(resp.content),
                    )
                )
            took = [r[0] for r in runs]
            rows.append(
                {
                    "query": name,
                    "prometheus_s": None
                    if None in took
                    else round(statistics.median(t for t in took if t is not None), 3),
                    "wall_s": round(statistics.median(r[1] for r in runs), 3),
                    "decode_s": round(statistics.median(r[2] for r in runs), 3),
                    "samples": runs[-1][3],
                    "mib": round(runs[-1][4] / 2**20, 1),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    prom_rss = psutil.Process(prom.process.pid).memory_info().rss
    return {
        **idle,
        "prometheus_rss_mib": round(prom_rss / 2**20),
        "recorded": args.recorded,
        "queries": rows,
        "load1": round(os.getloadavg()[0], 2),
    }


def write_probe(result: dict, args: argparse.Namespace, argv: list[str]) -> int:
    lines = [
        f"bench.prom_scale --probe  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
        f"({os.cpu_count()} cores, shared)",
        f"command: .venv/bin/python -m bench.prom_scale {' '.join(argv)}".rstrip(),
        "",
        f"fleet (SIMULATED exporter, scraped by a real Prometheus every {args.scrape} s):",
        f"  {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.nodes * DEPLOYMENTS_PER_NODE} vLLM "
        f"deployments; {result['head_series']:,} series in the head, Prometheus RSS "
        f"{result['prometheus_rss_mib']} MiB, first ingest {result['first_ingest_s']} s, "
        f"recording rules {'on' if result['recorded'] else 'off'}",
        "",
        f"with no query at all, over {args.idle:g} s (% of one core): Prometheus "
        f"{result['prometheus_idle_cpu_pct']}, the exporter {result['exporter_idle_cpu_pct']}",
        "",
        f"each query alone, one after another, median of {PROBE_RUNS} "
        "(prometheus: its execTotalTime; decode: the console's msgspec decoder):",
        f"  {'query':<40}{'prometheus s':>13}{'wall s':>9}{'decode s':>10}"
        f"{'samples':>10}{'MiB':>8}",
    ]

    def secs(v: float | None) -> str:
        return "?" if v is None else f"{v:.3f}"

    for row in result["queries"]:
        lines.append(
            f"  {row['query']:<40}{secs(row['prometheus_s']):>13}{row['wall_s']:>9.3f}"
            f"{row['decode_s']:>10.3f}{row['samples']:>10}{row['mib']:>8}"
        )
    console = [r for r in result["queries"] if not r["query"].startswith("cand:")]
    took = [r["prometheus_s"] for r in console]
    summed_prometheus = None if None in took else sum(took)
    lines += [
        f"  {'the console refresh, summed':<40}"
        f"{secs(summed_prometheus):>13}"
        f"{sum(r['wall_s'] for r in console):>9.3f}{sum(r['decode_s'] for r in console):>10.3f}"
        f"{sum(r['samples'] for r in console):>10}{round(sum(r['mib'] for r in console), 1):>8}",
        "",
        f"load1 at the end: {result['load1']}",
    ]
    Path(args.out or PROBE_EVIDENCE).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0
