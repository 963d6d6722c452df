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

The parts: the exporter (bench.prom_exporter), the console's side (bench.prom_console),
the probe (bench.prom_probe); this module runs them and writes the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.prom_console import REFRESH_S, measure_console  # noqa: E402
from bench.prom_exporter import DEPLOYMENTS_PER_NODE, GPUS_PER_NODE, serve_exporter  # noqa: E402
from bench.prom_probe import probe, write_probe  # noqa: E402
from tests.engines.servers import free_port  # noqa: E402
from tests.prometheus_proc import (  # noqa: E402
    PrometheusProc,
    config_text,
    start_prometheus,
    stop_prometheus,
)

EVIDENCE = ROOT / "docs" / "evidence" / "bench-prom-scale.txt"
SHARDS = 20


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
            from console.collect.prometheus.promql import recording_rules
            from console.core.config.load import parse_fleet
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
