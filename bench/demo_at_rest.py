"""The demo fleet at rest raises only the incidents it places on purpose (issue 30).

    make bench        (or: .venv/bin/python -m bench.demo_at_rest [--minutes N])

The SIMULATED demo fleet (`engineroom demo --no-tui`, 4 nodes) places its incidents on
purpose (console/sim/demo_layout.py): an uncorrected ECC error on one GPU, a TensorRT-LLM
engine built for an older driver, a mistral deployment whose TTFT breaches now and then,
and a llama-70b deployment whose queue surges now and then. `engineroom diagnose --json`
looks every LOOK_S, as an on-call engineer would over SSH, for long enough to see each
cycle of the breach and the surge. Every diagnosis that is none of those is unexplained:
the target is zero.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.sim import demo_layout as layout  # noqa: E402
from console.sim.fleetfile import TOKEN_ENV, node_name  # noqa: E402
from console.sim.load import BREACH_CYCLE_S, SURGE_CYCLE_S  # noqa: E402

NODES = 4
LOOK_S = 10.0


def placed() -> dict[tuple[str, str], str]:
    """(class, deployment) of each incident the demo places (its subject where it names
    no deployment: a GPU), and what it stands for."""
    specs = layout.plan(NODES)
    ecc_node, ecc_gpu = layout.ecc_gpu_of(NODES)
    out = {("gpu_fault", f"{node_name(ecc_node, 2)}/gpu{ecc_gpu}"): "the ECC GPU"}
    # console/sim/demo_drills.py builds the first Triton deployment's engine for an older driver
    stale = next(s for s in specs if s.kind == "triton")
    for spec in specs:
        where = spec.deployment_id
        if spec.traffic.ttft_breach:
            out[("replica_imbalance", where)] = "the mistral TTFT breach"
        if spec.traffic.queue_surge:  # a flood: its queue, and its KV cache nearly full
            out[("replica_imbalance", where)] = "the llama-70b queue surge"
            out[("kv_pressure", where)] = "the llama-70b queue surge"
        if spec is stale:
            out[("stale_trt_engine", where)] = "the engine built for an older driver"
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    default = max(BREACH_CYCLE_S, SURGE_CYCLE_S) / 60 + 1  # each incident's cycle seen
    parser.add_argument("--minutes", type=float, default=default)
    args = parser.parse_args()
    env = {**os.environ, TOKEN_ENV: "bench-demo-at-rest-token"}
    demo = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "demo", "--no-tui", "--nodes", str(NODES)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    expected = placed()
    seen: dict[tuple[str, str], str] = {}
    unexplained: dict[tuple[str, str], str] = {}  # -> the diagnosis's subject
    looks = 0
    try:
        assert demo.stdout is not None
        first = demo.stdout.readline()
        if not first.startswith("fleet: "):
            print(f"the demo did not start: {first!r}", file=sys.stderr)
            return 1
        fleet = first.removeprefix("fleet: ").strip()
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            out = subprocess.run(
                [sys.executable, "-m", "console.cli", "diagnose", "--fleet", fleet, "--json"],
                capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
            )  # fmt: skip
            looks += 1
            for x in json.loads(out.stdout)["diagnoses"]:
                key = (x["name"], x["deployment"] or x["subject"])
                if key not in seen:
                    seen[key] = time.strftime("%H:%M:%S")
                    what = expected.get(key, "UNEXPLAINED")
                    print(f"{seen[key]} {x['name']} {x['subject']}: {what}", file=sys.stderr)
                    if what == "UNEXPLAINED":
                        unexplained[key] = x["subject"]
            time.sleep(LOOK_S)
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(60)
    print(
        f"the demo fleet at rest ({NODES} nodes, SIMULATED), {args.minutes:.1f} min, "
        f"`engineroom diagnose --json` every {LOOK_S:g} s ({looks} looks)\n"
        f"  diagnoses of the incidents it places: {len(seen) - len(unexplained)} "
        f"of {len(expected)} placed\n"
        f"  unexplained diagnoses: {len(unexplained)} (target 0)"
    )
    for key, subject in unexplained.items():
        print(f"    {seen[key]} {key[0]} {subject}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
