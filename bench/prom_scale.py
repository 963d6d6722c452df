"""The console reading a 10,000-node fleet from Prometheus.

    .venv/bin/python -m bench.prom_scale [--nodes 10000] [--buckets 12] [--scrape 30]
                                         [--window 60] [--compare]

A SIMULATED exporter (its own process) serves the series of N nodes x 8 GPUs in
dcgm-exporter's names and labels, and 2 vLLM deployments per node in vLLM's names
(`vllm:*`, histograms with `--buckets` finite buckets each), values changing every scrape
(counters grow at each deployment's own rate). A real Prometheus (Debian's) scrapes it
in 20 shards every `--scrape` s, `honor_labels` on, so each series keeps the
`instance` and `node` labels it would carry in a real fleet. Backfilling with promtool
was tried on paper and left: to keep rate() windows live through a run of minutes the
blocks would hold tens of millions of samples, more than 2 shared cores build in the
time; a scrape is also what a real Prometheus does.

The console is the real app, headless (Textual's run_test), in its own process, with a
fleet file that names no node: every node is discovered from the series. Reported:
- queries per refresh and Prometheus' own time per refresh (execTotalTime, summed over
  the queries; they run concurrently, so the refresh's wall time is the other figure);
- console CPU (% of one core) and RSS over a 30 s window of steady refreshing;
- first full screen: app start until every node is up on the Fleet screen (the first
  read shows nodes before all its answers are in: then the GPU readings may still be
  unknown), and first read whole: until every answer of the first read was read;
- key-to-screen on Fleet and Models (median and worst of 10), as bench.console_scale:
  from the key to the target screen's first frame after its draw (bench.keypress);
- with --compare, bench.console_scale's agent-stream console at 1,000 nodes, same run.
Targets (issue 16): a 2 s refresh at 10,000 nodes with console CPU <= 35 % of one core,
first full screen <= 3 s, key-to-screen median < 100 ms. `load1` says how busy the
machine was: on a shared 2-core machine, latencies mean little above 2.

Writes docs/evidence/bench-prom-scale.txt.

With --probe, no console: after the ingest, the Prometheus' and the exporter's CPU over
60 s with no query at all (the floor a console's queries stand on), then each of the
console's queries alone, one after another (3 runs each: Prometheus' own time, the wall
time, samples, bytes, and the console's decoding of the answer), then candidate queries
for a cheaper refresh (one GPU index of 8; per-node GPU aggregates; p95 only). Writes
docs/evidence/bench-prom-queries.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.keypress import KeyTime, press  # noqa: E402
from tests.engines.servers import free_port  # noqa: E402
from tests.prometheus_proc import (  # noqa: E402
    PrometheusProc,
    config_text,
    start_prometheus,
    stop_prometheus,
)

EVIDENCE = ROOT / "docs" / "evidence" / "bench-prom-scale.txt"
PROBE_EVIDENCE = ROOT / "docs" / "evidence" / "bench-prom-queries.txt"
PROBE_RUNS = 3
GPUS_PER_NODE = 8
DEPLOYMENTS_PER_NODE = 2
SHARDS = 20
WINDOW_S = 60.0  # refreshes in slices; the whole read before it is reported apart
REFRESH_S = 2.0
# vLLM's TTFT, ITL and e2e bucket bounds, cut to `--buckets` (their first ones).
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
              5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


# -- the SIMULATED exporter ----------------------------------------------------------------


class SyntheticFleet:
    """The series of `nodes` nodes, rendered per shard; values are functions of time."""

    def __init__(self, nodes: int, buckets: int) -> None:
        self.nodes = nodes
        self.start = time.time()
        self.hist = {
            "vllm:time_to_first_token_seconds": TTFT_BOUNDS[:buckets],
            "vllm:inter_token_latency_seconds": ITL_BOUNDS[:buckets],
            "vllm:e2e_request_latency_seconds": E2E_BOUNDS[:buckets],
        }

    def shard(self, index: int, of: int) -> bytes:
        t = time.time() - self.start
        tick = int(t)
        out: list[str] = []
        add = out.append
        for n in range(index, self.nodes, of):
            host = f"node-{n:05d}"
            ip = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
            for g in range(GPUS_PER_NODE):
                labels = (
                    f'gpu="{g}",UUID="GPU-{n:08x}-0000-0000-0000-{g:012d}",device="nvidia{g}",'
                    f'modelName="NVIDIA H200",Hostname="{host}",instance="{ip}:9400",'
                    'DCGM_FI_DRIVER_VERSION="550.54.15"'
                )
                wave = (n * 7 + g * 13 + tick) % 100
                add(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {wave}")
                add(f"DCGM_FI_DEV_FB_USED{{{labels}}} {40000 + wave * 900}")
                add(f"DCGM_FI_DEV_FB_FREE{{{labels}}} {101000 - wave * 900}")
                add(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {35 + wave // 3}")
                add(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {120 + wave * 5}")
                add(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 0")
            for d in range(DEPLOYMENTS_PER_NODE):
                labels = (
                    f'model_name="model-{(n * DEPLOYMENTS_PER_NODE + d) % 500:03d}",'
                    f'engine="0",node="{host}",instance="{ip}:{8000 + d}"'
                )
                rate = 0.5 + (n * 31 + d * 17) % 45 / 10  # requests/s, per deployment
                requests = int(rate * t)
                add(f"vllm:num_requests_running{{{labels}}} {(tick + n) % 16}")
                add(f"vllm:num_requests_waiting{{{labels}}} {(tick + n) % 5}")
                add(f"vllm:kv_cache_usage_perc{{{labels}}} {((tick + n) % 90) / 100}")
                add(f'vllm:request_success_total{{{labels},finished_reason="stop"}} {requests}')
                add(f'vllm:request_success_total{{{labels},finished_reason="error"}} '
                    f"{requests // 200}")  # fmt: skip
                shape = 0.3 + (n + d) % 7 / 10  # where each deployment's latency sits
                for name, bounds in self.hist.items():
                    count = (
                        requests if name != "vllm:inter_token_latency_seconds" else requests * 40
                    )
                    below = 0.0
                    for i, bound in enumerate(bounds):
                        below = min(1.0, below + shape / (i + 2))
                        add(f'{name}_bucket{{{labels},le="{bound}"}} {int(count * below)}')
                    add(f'{name}_bucket{{{labels},le="+Inf"}} {count}')
                    add(f"{name}_sum{{{labels}}} {count * bounds[len(bounds) // 3]:.3f}")
                    add(f"{name}_count{{{labels}}} {count}")
        add("")
        return "\n".join(out).encode()


def serve_exporter(nodes: int, buckets: int, port: int) -> None:
    fleet = SyntheticFleet(nodes, buckets)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            query = parse_qs(urlsplit(self.path).query)
            body = fleet.shard(int(query["shard"][0]), int(query["of"][0]))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("serving", flush=True)
    server.serve_forever()


# -- the console, headless, in its own process ---------------------------------------------


async def measure_console(fleet_path: Path, nodes: int) -> dict[str, object]:
    from console.collect.promsource import PromSource
    from console.core.config import load_fleet
    from console.tui.app import EngineroomApp
    from console.tui.screens.fleet import FleetScreen
    from console.tui.screens.models import ModelsScreen

    fleet = load_fleet(fleet_path)
    source = PromSource(fleet)
    refreshes: list[
        tuple[float, float, int, bool, int]
    ] = []  # prom s, wall s, queries, full, samples
    seen = [0.0]

    failed: list[str] = []  # what a failing query said (the first 5), with the refresh kind

    def note_refresh() -> None:
        health = source.health
        if health.last_ok is not None and health.last_ok != seen[0]:
            seen[0] = health.last_ok
            if health.error and len(failed) < 5:
                kind = "whole" if health.full else "sliced"
                failed.append(f"{kind}: {health.failed} failed: {health.error[:160]}")
            refreshes.append(
                (
                    health.prometheus_s or 0.0,
                    health.wall_s or 0.0,
                    health.queries,
                    bool(health.full),
                    health.samples,
                )
            )

    app = EngineroomApp(fleet, collector=source)
    me = psutil.Process()
    started = time.monotonic()
    first = None
    async with app.run_test(size=(160, 50)) as pilot:
        shown: float | None = None  # when the first node showed up
        answered: list[tuple[float, int]] = []  # (s, answers in) through the first read
        while time.monotonic() - started < 120:
            note_refresh()
            view, screen = app.view, app.screen
            if shown is None and view is not None and view.summary.nodes_up:
                shown = time.monotonic() - started
            if not answered or answered[-1][1] != source.health.answered:
                answered.append((round(time.monotonic() - started, 2), source.health.answered))
            if (
                view is not None
                and view.summary.nodes_up >= nodes
                and isinstance(screen, FleetScreen)
                and screen.drawn_nodes >= nodes
            ):
                first = time.monotonic() - started
                break
            await asyncio.sleep(0.02)
        # The first screen may show the nodes before every answer of the first read is in
        # (PromSource.first_look_s): how long until all of it was read.
        while source.health.ok is None and time.monotonic() - started < 180:
            await asyncio.sleep(0.02)
        whole = time.monotonic() - started if source.health.ok is not None else None
        note_refresh()
        await pilot.pause(2)
        cpu0, wall0 = me.cpu_times(), time.monotonic()
        keys: dict[str, list[KeyTime]] = {"fleet": [], "models": []}
        next_key = wall0 + 1.0
        while time.monotonic() - wall0 < WINDOW_S:
            note_refresh()
            if time.monotonic() >= next_key and sum(map(len, keys.values())) < 20:
                to_models = isinstance(app.screen, FleetScreen)
                target = ModelsScreen if to_models else FleetScreen
                took = await press(app, "m" if to_models else "n", target)
                keys["models" if to_models else "fleet"].append(took)
                next_key = time.monotonic() + 1.0
            await asyncio.sleep(0.1)
        cpu1, wall1 = me.cpu_times(), time.monotonic()
        rss = me.memory_info().rss
        view = app.view
        ticks = list(app.tick_ms)[-int(WINDOW_S) :]
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "nodes": nodes,
        "nodes_up": view.summary.nodes_up if view else None,
        "gpus": view.summary.gpus if view else None,
        "deployments": sum(len(r) for r in view.models.values()) if view else None,
        "queries_per_refresh": refreshes[-1][2] if refreshes else None,
        **_refresh_figures(refreshes, full=True),
        **_refresh_figures(refreshes, full=False),
        "console_cpu_pct": round(100 * cpu_s / (wall1 - wall0), 1),
        "console_rss_mib": round(rss / 2**20, 1),
        "first_full_screen_s": round(first, 2) if first is not None else None,
        "first_read_whole_s": round(whole, 2) if whole is not None else None,
        "first_node_shown_s": round(shown, 2) if shown is not None else None,
        "query_failures": failed,
        "first_read_answers": answered,
        **key_figures(keys),
        "tick_build_ms_median": round(statistics.median(b for b, _ in ticks), 1) if ticks else None,
        "tick_draw_ms_median": round(statistics.median(d for _, d in ticks), 1) if ticks else None,
        "load1": round(os.getloadavg()[0], 2),
    }


def key_figures(keys: dict[str, list[KeyTime]]) -> dict[str, object]:
    """Medians and the worst of the key presses to each screen, to its first frame; and
    the medians as measured before (bench.keypress)."""
    out: dict[str, object] = {}
    for screen, times in keys.items():
        out[f"key_to_{screen}_median_ms"] = (
            round(statistics.median(k.frame_ms for k in times), 1) if times else None
        )
    every = [k for times in keys.values() for k in times]
    out["key_to_screen_max_ms"] = round(max(k.frame_ms for k in every), 1) if every else None
    for screen, times in keys.items():
        out[f"key_to_{screen}_noticed_median_ms"] = (
            round(statistics.median(k.noticed_ms for k in times), 1) if times else None
        )
    return out


def _refresh_figures(
    refreshes: list[tuple[float, float, int, bool, int]], full: bool
) -> dict[str, object]:
    """Medians of the whole-fleet refreshes (the first included), or of the sliced ones
    between them."""
    kind = "whole" if full else "sliced"
    picked = [r for r in refreshes if r[3] == full]
    if not picked:
        return {f"{kind}_refreshes": 0}
    return {
        f"{kind}_refreshes": len(picked),
        f"{kind}_wall_s_median": round(statistics.median(r[1] for r in picked), 2),
        f"{kind}_prometheus_s_median": round(statistics.median(r[0] for r in picked), 2),
        f"{kind}_samples_median": int(statistics.median(r[4] for r in picked)),
    }


# -- the run -------------------------------------------------------------------------------


def wait_for(prom: PrometheusProc, expr: str, want: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    got = 0.0
    while time.monotonic() < deadline:
        try:
            result = prom.query(expr)
        except Exception:  # Prometheus busy ingesting: ask again
            result = []
        got = float(result[0]["value"][1]) if result else 0.0
        if got >= want:
            return time.monotonic()
        prom.check_alive()
        time.sleep(2)
    raise TimeoutError(f"{expr}: {got:g} of {want:g} after {timeout:g} s")


def probe(
    prom: PrometheusProc, exporter: subprocess.Popen[str], args: argparse.Namespace
) -> dict[str, object]:
    """The ingest floor, then each query alone (see the module's docstring)."""
    import httpx

    from console.collect.promql import ANSWER, DCGM_READINGS, _tag, fleet_queries, matcher
    from console.collect.promsource import SLICE_CYCLE_S
    from console.core.config import parse_fleet
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


def run(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="prom-scale-"))
    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "bench.prom_scale", "--exporter", str(port),
         "--nodes", str(args.nodes), "--buckets", str(args.buckets)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    prom = None
    try:
        assert exporter.stdout is not None
        exporter.stdout.readline()
        jobs = [
            {
                "job_name": f"fleet-{i}",
                "honor_labels": True,
                "scrape_interval": f"{args.scrape}s",
                "scrape_timeout": f"{args.scrape - 1}s",
                "params": {"shard": [str(i)], "of": [str(SHARDS)]},
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
            for i in range(SHARDS)
        ]
        rule_files = []
        section = f'url = "http://127.0.0.1:1"\nwindow_s = {args.window}\n'
        if args.recorded:  # the latency and rate figures kept by recording rules
            from console.collect.promql import recording_rules
            from console.core.config import parse_fleet
            from console.core.plugin import plugin_kinds

            parsed = parse_fleet(f'[fleet]\nname = "x"\n[prometheus]\n{section}')
            assert parsed.prometheus is not None
            engines = {k: c.prometheus for k, c in plugin_kinds().items() if c.prometheus}
            rules = recording_rules(parsed.prometheus, engines, args.scrape)
            (work / "rules.yml").write_text(json.dumps(rules))
            rule_files.append(work / "rules.yml")
        t0 = time.monotonic()
        prom = start_prometheus(
            work / "prom",
            config=config_text(jobs, interval=f"{args.scrape}s", rule_files=rule_files),
        )
        gpus = args.nodes * GPUS_PER_NODE
        deployments = args.nodes * DEPLOYMENTS_PER_NODE
        wait_for(prom, "count(DCGM_FI_DEV_GPU_UTIL)", gpus, 600)
        # rate() needs two scrapes inside its window
        wait_for(
            prom,
            f"count(rate(vllm:e2e_request_latency_seconds_count[{args.window}s]))",
            deployments,
            600,
        )
        if args.recorded:
            # Every recorded family, through the last rule of the group: waiting for TTFT
            # alone let the first read start while the counters were still being recorded
            # for the first time (an empty answer, and Prometheus busy with the rest).
            for figure in ("e2e", "itl", "ttft", "counters"):
                wait_for(
                    prom,
                    f"count(count by (instance) (engineroom:vllm:{figure}:{args.window}s))",
                    deployments,
                    600,
                )
        ingested_s = time.monotonic() - t0
        series = float(prom.api("status/tsdb")["headStats"]["numSeries"])
        if args.probe:
            probed = probe(prom, exporter, args)
            probed.update(head_series=int(series), first_ingest_s=round(ingested_s, 1))
            return probed
        fleet_path = work / "fleet.toml"
        fleet_path.write_text(
            f'[fleet]\nname = "prom-scale"\nrefresh_s = {REFRESH_S}\n'
            f'[prometheus]\nurl = "{prom.url}"\nwindow_s = {args.window}\ntimeout_s = 120\n'
            f"recorded = {str(args.recorded).lower()}\n"
        )
        console = subprocess.run(
            [sys.executable, "-m", "bench.prom_scale", "--console", str(fleet_path),
             "--nodes", str(args.nodes)],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if console.returncode != 0:
            raise RuntimeError(f"the console run failed:\n{console.stderr[-3000:]}")
        result = json.loads(console.stdout.strip().splitlines()[-1])
        prom_rss = psutil.Process(prom.process.pid).memory_info().rss
        result.update(
            head_series=int(series),
            buckets_per_histogram=args.buckets,
            scrape_s=args.scrape,
            window_s=args.window,
            prometheus_rss_mib=round(prom_rss / 2**20),
            recorded=args.recorded,
            first_ingest_s=round(ingested_s, 1),
        )
        return result
    finally:
        if prom is not None:
            stop_prometheus(prom)
        exporter.terminate()
        exporter.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)  # Prometheus' blocks: 100-400 MB a run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--buckets", type=int, default=12)
    parser.add_argument("--scrape", type=int, default=30)
    parser.add_argument("--window", type=int, default=60)
    parser.add_argument("--compare", action="store_true", help="also the 1,000-node agent stream")
    parser.add_argument("--recorded", action="store_true", help="figures from recording rules")
    parser.add_argument("--probe", action="store_true", help="each query alone; no console")
    parser.add_argument("--idle", type=float, default=60.0, help="--probe: the idle window, s")
    parser.add_argument("--out", default=None)
    parser.add_argument("--exporter", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--console", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.exporter:
        serve_exporter(args.nodes, args.buckets, args.exporter)
        return 0
    if args.console:
        print(json.dumps(asyncio.run(measure_console(Path(args.console), args.nodes))))
        return 0
    result = run(args)
    print(json.dumps(result), flush=True)
    if args.probe:
        return write_probe(result, args, argv)
    lines = [
        f"bench.prom_scale  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
        f"({os.cpu_count()} cores, shared)",
        f"command: .venv/bin/python -m bench.prom_scale {' '.join(argv)}".rstrip(),
        "",
        f"fleet (SIMULATED exporter, scraped by a real Prometheus {args.scrape} s):",
        f"  {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.nodes * DEPLOYMENTS_PER_NODE} "
        f"vLLM deployments, {args.buckets} buckets a histogram; "
        f"{result['head_series']:,} series in Prometheus' head "
        f"({result['prometheus_rss_mib']} MiB)",
        "",
        "console (headless, its own process, every node discovered from the series):",
    ]
    for key, value in result.items():
        lines.append(f"  {key:<34}{value}")
    if args.compare:
        compare = subprocess.run(
            [sys.executable, "-m", "bench.console_scale", "1000", "stream"],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        lines += ["", "same run, the agent-stream console at 1,000 nodes (bench.console_scale):"]
        lines += ["  " + line for line in compare.stdout.strip().splitlines()[-3:]]
    lines += [
        "",
        "targets (issue 16): refresh 2 s at 10,000 nodes, console CPU <= 35 % of one core,",
        "first full screen <= 3 s, key-to-screen median < 100 ms",
    ]
    Path(args.out or EVIDENCE).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
