"""Recording: its size per node-hour, what it costs the console, and replay's seek time.

    .venv/bin/python -m bench.recording [--quick]      (part of `make bench`)

1. Size: `engineroom record`'s own code (console.collect.recordings.recorder.record) on the
   SIMULATED scale fleet (`python -m console.sim --scale N`, 8 GPUs and 2 engines a node,
   new values every second) at 10, 100 and 1,000 nodes. The file's growth is measured
   over a steady minute (from 30 s to 90 s after the start, so exactly one 60 s keyframe
   falls in it) and scaled to a node-hour: bytes / nodes / (60 s / 3600 s). Real time,
   not simulated faster.
2. Console CPU at 1,000 nodes, without and with `--record`, alternated (off, on, off, on)
   in the same run, each a 20 s window after the first full screen; medians and the ratio.
3. Seek: a 1-hour, 100-node recording GENERATED FASTER THAN REAL TIME from the simulator's
   snapshot model (each simulated second: every node's snapshot rebuilt with that
   second's time, written through the real RecordingWriter), then the replay collector
   moved to 60 random moments (backward and forward): median, p95 and worst. Target:
   under 200 ms.
Output: docs/evidence/bench-recording.txt. `load1` is the machine's load average: on a
shared machine CPU figures mean little when it is above the core count.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.console_scale import pct, start_scale_fleet  # noqa: E402
from console.collect.recordings.reader import Recording  # noqa: E402
from console.collect.recordings.recorder import record  # noqa: E402
from console.collect.recordings.replay import ReplayCollector  # noqa: E402
from console.collect.recordings.writer import RecordingWriter  # noqa: E402
from console.collect.sources.collector import Collector  # noqa: E402
from console.core.config.load import load_fleet, parse_fleet  # noqa: E402
from console.sim.fleetfile import TOKEN_ENV  # noqa: E402
from console.sim.scale import _Node  # noqa: E402
from console.tui.app import EngineroomApp  # noqa: E402
from console.tui.screens.fleet import FleetScreen  # noqa: E402

OUT = ROOT / "docs" / "evidence" / "bench-recording.txt"
WINDOW_S = 20.0


async def _size_run(fleet_path: Path, out: Path, from_s: float, to_s: float) -> tuple[int, int]:
    """Record for `to_s`; the file's size at `from_s` and at `to_s`."""
    fleet = load_fleet(fleet_path)
    task = asyncio.create_task(record(fleet, out, to_s))
    await asyncio.sleep(from_s)  # the bench's clock, not a wait on state: it measures time
    at_from = out.stat().st_size
    await task
    return at_from, out.stat().st_size


def size_per_node_hour(nodes: int, token: str, from_s: float, to_s: float) -> dict:
    proc, fleet_path = start_scale_fleet(nodes, token)
    try:
        time.sleep(1.5)  # the simulated agents have built their first snapshots
        out = Path(tempfile.mkdtemp()) / f"scale{nodes}.rec"
        at_from, at_to = asyncio.run(_size_run(fleet_path, out, from_s, to_s))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    recording = Recording(out)
    gaps = [e for e in recording.events if e.get("kind") == "gap"]
    window_h = (to_s - from_s) / 3600
    per_node_hour = (at_to - at_from) / nodes / window_h
    return {
        "nodes": nodes,
        "window_s": to_s - from_s,
        "bytes_in_window": at_to - at_from,
        "bytes_per_node_hour": round(per_node_hour),
        "mib_per_100_nodes_8h": round(per_node_hour * 100 * 8 / 2**20, 1),
        "dropped": sum(int(g["message"].split()[0]) for g in gaps),
        "load1": round(os.getloadavg()[0], 2),
    }


async def _console_cpu(fleet_path: Path, nodes: int, record_to: Path | None) -> float:
    fleet = load_fleet(fleet_path)
    app = EngineroomApp(fleet, collector=Collector(fleet), record=record_to)
    me = psutil.Process()
    started = time.monotonic()
    async with app.run_test(size=(120, 40)) as pilot:
        while time.monotonic() - started < 60:
            view, screen = app.view, app.screen
            if (
                view is not None
                and view.summary.nodes_up == nodes
                and isinstance(screen, FleetScreen)
            ):
                break
            await asyncio.sleep(0.05)
        await pilot.pause(3)
        cpu0, wall0 = me.cpu_times(), time.monotonic()
        await pilot.pause(WINDOW_S)
        cpu1, wall1 = me.cpu_times(), time.monotonic()
    return 100 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (wall1 - wall0)


def console_cpu(nodes: int, token: str, rounds: int) -> dict:
    proc, fleet_path = start_scale_fleet(nodes, token)
    off: list[float] = []
    on: list[float] = []
    dropped = 0
    try:
        time.sleep(1.5)
        for i in range(rounds):
            off.append(asyncio.run(_console_cpu(fleet_path, nodes, None)))
            out = Path(tempfile.mkdtemp()) / f"console{i}.rec"
            on.append(asyncio.run(_console_cpu(fleet_path, nodes, out)))
            gaps = [e for e in Recording(out).events if e.get("kind") == "gap"]
            dropped += sum(int(g["message"].split()[0]) for g in gaps)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    return {
        "nodes": nodes,
        "cpu_pct_without": [round(x, 1) for x in off],
        "cpu_pct_with": [round(x, 1) for x in on],
        "median_without": round(statistics.median(off), 1),
        "median_with": round(statistics.median(on), 1),
        "ratio": round(statistics.median(on) / statistics.median(off), 2),
        "dropped_with": dropped,
        "load1": round(os.getloadavg()[0], 2),
    }


SEEK_FLEET = """\
[fleet]
name = "SIMULATED seek bench"
refresh_s = 1.0
"""


def seek_time(nodes: int, seconds: int, samples: int) -> dict:
    """Generate `seconds` of `nodes` faster than real time, then seek at random."""
    rng = random.Random(18)
    sim = [_Node(i, 8, random.Random(i)) for i in range(nodes)]
    text = SEEK_FLEET + "".join(
        f'\n[[nodes]]\nname = "{n.name}"\nagent = "http://127.0.0.1:9"\n' for n in sim
    )
    path = Path(tempfile.mkdtemp()) / "hour.rec"
    writer = RecordingWriter(path, fleet_text=text, queue_limit=100_000)
    t0 = 1_796_083_200.0
    made = time.monotonic()
    for second in range(seconds):
        t = t0 + second
        for node in sim:
            node.rebuild(t)
            node.snapshot["node"]["time"] = t
            writer.node(node.name, json.loads(json.dumps(node.snapshot)), "up", None, t=t)
        while writer._queue.qsize() > 50_000:  # let the writer's thread catch up
            time.sleep(0.01)
    writer.close(timeout=600)
    generated_s = time.monotonic() - made
    opened = time.monotonic()
    recording = Recording(path)
    open_ms = (time.monotonic() - opened) * 1000
    fleet = parse_fleet(text)
    replay = ReplayCollector(fleet, recording=recording)
    took: list[float] = []
    for _ in range(samples):
        target = rng.uniform(recording.start, recording.end)
        began = time.perf_counter()
        replay.move_to(target)
        took.append((time.perf_counter() - began) * 1000)
        assert replay.states[sim[0].name].snapshot is not None
    return {
        "nodes": nodes,
        "recorded_s": seconds,
        "file_mib": round(path.stat().st_size / 2**20, 1),
        "bytes_per_node_hour": round(path.stat().st_size / nodes / (seconds / 3600)),
        "generated_in_s": round(generated_s, 1),
        "open_ms": round(open_ms, 1),
        "seek_ms_median": round(statistics.median(took), 1),
        "seek_ms_p95": round(pct(took, 0.95), 1),
        "seek_ms_max": round(max(took), 1),
        "dropped": writer.dropped,
        "load1": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str]) -> int:
    """`size`, `cpu`, `seek` pick parts (default all); `--quick` shortens every part and
    writes no evidence file."""
    quick = "--quick" in argv
    parts = [p for p in ("size", "cpu", "seek") if p in argv] or ["size", "cpu", "seek"]
    token = secrets.token_urlsafe(24)
    os.environ[TOKEN_ENV] = token
    lines = [
        f"bench.recording {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} "
        f"({'quick' if quick else 'full'}: {' '.join(parts)}); {os.cpu_count()} CPUs",
        "",
    ]

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if "size" in parts:
        say("1. Size: engineroom record on the SIMULATED scale fleet (8 GPUs, 2 engines a")
        say("   node, new values every 1 s), the file's growth over a steady 60 s window")
        say("   (keyframes every 20 s inside it), scaled to a node-hour")
        window = (20.0, 50.0) if quick else (30.0, 90.0)
        for nodes in (10, 100) if quick else (10, 100, 1000):
            say("   " + json.dumps(size_per_node_hour(nodes, token, *window)))
        say("")
    if "cpu" in parts:
        say("2. Console CPU (% of one core) at 1,000 SIMULATED nodes, without and with")
        say(f"   --record, alternated in this run, {WINDOW_S:g} s windows")
        say("   " + json.dumps(console_cpu(1000, token, 1 if quick else 3)))
        say("")
    if "seek" in parts:
        seconds = 600 if quick else 3600
        say(f"3. Seek: {seconds} s of 100 SIMULATED nodes GENERATED FASTER THAN REAL TIME,")
        say("   then the replay collector moved to 60 random moments (target < 200 ms)")
        say("   " + json.dumps(seek_time(100, seconds, 60)))
    if not quick:
        out = OUT if len(parts) == 3 else OUT.with_name(f"bench-recording-{'-'.join(parts)}.txt")
        out.write_text("\n".join(lines) + "\n")
        print(f"\nwritten to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
