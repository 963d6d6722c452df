"""The console at 10, 100 and 1,000 nodes of 8 GPUs, refreshing every second.

    make bench-console        (or: .venv/bin/python -m bench.console_scale [10 100 1000])

The nodes are the SIMULATED scale fleet (`python -m console.sim --scale N`, another
process): lightweight agents serving changing snapshots. The console is the real app,
headless (Textual's run_test) in this process, so this process's CPU is the console's.

Reported per fleet size:
- update p50/p99: with polling, one node's poll, request to validated snapshot (the
  collector's cycle); with the stream, the delay from the agent taking a snapshot to the
  console holding it;
- freshness p99: age of the newest snapshot across all nodes, sampled every second;
- console CPU (% of one core) and RSS over a 20 s window of steady refreshing;
- key-to-screen: a key press (posted like a terminal's) until the new screen has drawn
  its data from the fleet view and composed its first frame after, while the fleet
  refreshes (median and worst of 10; bench.keypress);
- first full screen: app start until every node is up on the Fleet screen.
Targets at 1,000 nodes streaming (issue 15): CPU <= 35 %, RSS <= 300 MiB, first screen
<= 2 s, key-to-screen median < 100 ms and worst < 250 ms, freshness p99 <= 1.5 s; polling,
poll p99 < 1 s. For comparison, all-smi refreshes 100+ hosts every 6 s; k9s at least 2 s.
`load1` is the machine's load average as the window closed: on a shared machine the CPU
and latency figures mean little when it is above the core count.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.keypress import KeyTime, press  # noqa: E402
from console.collect.sources.collector import Collector, NodeState  # noqa: E402
from console.core.config.load import load_fleet  # noqa: E402
from console.sim.fleetfile import TOKEN_ENV  # noqa: E402
from console.tui.app import EngineroomApp  # noqa: E402
from console.tui.screens.fleet import FleetScreen  # noqa: E402
from console.tui.screens.models import ModelsScreen  # noqa: E402

WINDOW_S = 20.0


def start_scale_fleet(nodes: int, token: str) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "console.sim",
            "--scale",
            str(nodes),
            "--refresh",
            "1.0",
            "--out",
            tempfile.mkdtemp(prefix=f"scale{nodes}-"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, TOKEN_ENV: token},
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("fleet: "):
        proc.kill()
        raise RuntimeError(f"scale fleet of {nodes} did not start: {line!r}")
    return proc, Path(line.removeprefix("fleet: ").strip())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Mode = Literal["stream", "poll"]


async def measure(fleet_path: Path, nodes: int, mode: Mode) -> dict[str, object]:
    fleet = load_fleet(fleet_path)
    polls: list[float] = []

    def on_update(state: NodeState) -> None:
        if state.poll_ms is not None and state.failures == 0:
            polls.append(state.poll_ms)

    app = EngineroomApp(fleet, collector=Collector(fleet, on_update=on_update, mode=mode))
    # The diagnoses' own share (issue 30: at most 2 % of a core at 1,000 nodes): the CPU
    # time of each look, in this thread, over the same window as the console's CPU.
    diagnosing = {"cpu_s": 0.0, "looks": 0}
    look = app.diagnoses.update

    def timed_look(*args: Any, **kwargs: Any) -> None:
        before, was = time.thread_time(), app.diagnoses.diagnoser.looks
        look(*args, **kwargs)
        diagnosing["cpu_s"] += time.thread_time() - before
        diagnosing["looks"] += app.diagnoses.diagnoser.looks - was

    app.diagnoses.update = timed_look  # type: ignore[method-assign]
    me = psutil.Process()
    started = time.monotonic()
    async with app.run_test(size=(120, 40)) as pilot:
        # first full screen: every node up, drawn on the Fleet screen
        first = None
        while time.monotonic() - started < 30:
            view = app.view
            screen = app.screen
            if (
                view is not None
                and view.summary.nodes_up == nodes
                and isinstance(screen, FleetScreen)
                and screen.drawn_nodes == nodes
            ):
                first = time.monotonic() - started
                break
            await asyncio.sleep(0.02)
        await pilot.pause(3)  # past the first round's stagger
        polls.clear()
        freshness: list[float] = []
        cpu0, wall0 = me.cpu_times(), time.monotonic()
        diagnosing.update(cpu_s=0.0, looks=0)
        keys: list[KeyTime] = []
        next_key = wall0 + 1.0
        while time.monotonic() - wall0 < WINDOW_S:
            now = time.monotonic()
            ages = [s.age(now) for s in app.collector.states.values()]
            freshness.append(
                max(a for a in ages if a is not None)
                if all(a is not None for a in ages)
                else float("inf")
            )
            if now >= next_key and len(keys) < 10:
                target = ModelsScreen if isinstance(app.screen, FleetScreen) else FleetScreen
                # The key goes in as a terminal's would, through the app's message queue
                # (pilot.press would also wait for the whole app to go idle).
                keys.append(await press(app, "m" if target is ModelsScreen else "n", target))
                next_key = time.monotonic() + 1.0
            await asyncio.sleep(0.25)
        cpu1, wall1 = me.cpu_times(), time.monotonic()
        diag_cpu_s, diag_looks = diagnosing["cpu_s"], diagnosing["looks"]
        rss = me.memory_info().rss
        ticks = list(app.tick_ms)[-int(WINDOW_S) :]
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "nodes": nodes,
        "mode": mode,
        "poll_p50_ms": round(statistics.median(polls), 1),
        "poll_p99_ms": round(pct(polls, 0.99), 1),
        "polls_per_s": round(len(polls) / (wall1 - wall0), 1),
        "freshness_p99_s": round(pct(freshness, 0.99), 2),
        "console_cpu_pct": round(100 * cpu_s / (wall1 - wall0), 1),
        "console_rss_mib": round(rss / 2**20, 1),
        "diagnoses_cpu_pct": round(100 * diag_cpu_s / (wall1 - wall0), 2),
        "diagnoses_looks_per_s": round(diag_looks / (wall1 - wall0), 2),
        "key_to_screen_median_ms": round(statistics.median(k.frame_ms for k in keys), 1),
        "key_to_screen_max_ms": round(max(k.frame_ms for k in keys), 1),
        "key_to_screen_each_ms": [round(k.frame_ms) for k in keys],  # Models, Fleet, ...
        "key_noticed_median_ms": round(statistics.median(k.noticed_ms for k in keys), 1),
        "first_full_screen_s": round(first, 2) if first is not None else -1.0,
        "tick_build_ms_median": round(statistics.median(b for b, _ in ticks), 1),
        "tick_draw_ms_median": round(statistics.median(d for _, d in ticks), 1),
        "load1": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str]) -> int:
    modes: list[Mode] = [m for m in ("stream", "poll") if m in argv] or ["stream", "poll"]
    sizes = [int(a) for a in argv if a.isdigit()] or [10, 100, 1000]
    token = secrets.token_urlsafe(24)
    os.environ[TOKEN_ENV] = token
    results = []
    for nodes in sizes:
        for mode in modes:
            proc, fleet_path = start_scale_fleet(nodes, token)
            try:
                time.sleep(1.5)  # the simulated agents have built their first snapshots
                results.append(asyncio.run(measure(fleet_path, nodes, mode)))
            finally:
                proc.terminate()
                proc.wait(timeout=20)
            print(json.dumps(results[-1]), flush=True)
    print(
        "\nnodes mode    update p50/p99 ms  freshness p99 s  CPU %  RSS MiB"
        "  key->screen med/max ms  first screen s  load1  diagnoses CPU % (looks/s)"
    )
    for r in results:
        print(
            f"{r['nodes']:>5} {r['mode']:<7} {r['poll_p50_ms']:>7}/{r['poll_p99_ms']:<9} "
            f"{r['freshness_p99_s']:>15}  {r['console_cpu_pct']:>5}  {r['console_rss_mib']:>7}"
            f"  {r['key_to_screen_median_ms']:>10}/{r['key_to_screen_max_ms']:<11}"
            f"  {r['first_full_screen_s']:>14}  {r['load1']:>5}"
            f"  {r['diagnoses_cpu_pct']:>6} ({r['diagnoses_looks_per_s']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
