"""How long planning a rollout takes, and the waves it makes (issue 31), on SIMULATED
fleets of 1,000 and 10,000 deployments.

    make bench        (or: .venv/bin/python -m bench.rollout_plan [--runs N] [--no-write])

The fleet.toml text is built here (console.sim.fleetfile's writer, the scale fleet's node
names): eight deployments a node; models of 2 to 16 deployments that carry traffic (weight
100 or 50), one in ten a model with a single carrying deployment and a standby at weight 0
with a launch profile, planned with --allow-standby. Every deployment is selected (a
fleet-wide restart). For each size and --max-unavailable 1 and 2 it prints the median of
--runs plannings (console.core.rollouts.planner.make_plan on the parsed fleet: what `rollout plan`
does after reading fleet.toml), the waves, the deployments and standbys planned, and the
median time to hold the plan to the rules again (`rollout check`'s check_plan) and to
write it as JSON and TOML (size of each). Output: docs/evidence/bench-rollout-plan.txt.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.core.config.load import Fleet, parse_fleet  # noqa: E402
from console.core.rollouts.plan_file import Plan, write_plan  # noqa: E402
from console.core.rollouts.planner import Ask, check_plan, counts, make_plan  # noqa: E402
from console.sim.fleetfile import FleetText, model_tables, node_name  # noqa: E402

OUT = ROOT / "docs" / "evidence" / "bench-rollout-plan.txt"
SIZES = (1_000, 10_000)
WIDTHS = (1, 2)
PER_NODE = 8  # deployments a node (one a GPU)


def fleet_toml(deployments: int, seed: int = 31) -> str:
    """A SIMULATED fleet.toml of `deployments` deployments across deployments/8 nodes."""
    rng = random.Random(seed)
    nodes = [node_name(i, 32) for i in range((deployments + PER_NODE - 1) // PER_NODE)]
    out = FleetText(f"SIMULATED fleet for bench.rollout_plan: {deployments} deployments")
    out.add("[fleet]", {"name": f"bench-{deployments}"})
    for node in nodes:
        out.add("[[nodes]]", {"name": node, "agent": "http://127.0.0.1:9"})
    models: list[tuple[str, dict[str, float], list[dict[str, object]]]] = []
    profiles = []
    made = 0
    while made < deployments:
        m = len(models)
        lone = m % 10 == 9  # one carrying deployment and a standby
        size = 2 if lone else rng.randint(2, 16)
        size = min(size, deployments - made)
        deps: list[dict[str, object]] = []
        for i in range(size):
            slot = made + i
            node, port = nodes[slot // PER_NODE], 8000 + slot % PER_NODE
            dep: dict[str, object] = {
                "id": f"m{m}-{i}",
                "node": node,
                "engine": "vllm",
                "endpoint": f"http://127.0.0.1:{port}",
                "weight": rng.choice((100, 50)),
            }
            if lone and i == 1:
                dep.update(weight=0, profile=f"m{m}-standby")
                profiles.append((f"m{m}-standby", node, f"model-{m}", port))
            deps.append(dep)
        models.append((f"model-{m}", {"ttft_p95_ms": 500.0}, deps))
        made += size
    model_tables(out, models)
    for name, node, model, port in profiles:
        out.add(
            f'[profiles."{name}"]',
            {"engine": "vllm", "node": node, "model": "/models/m", "served_model_name": model,
             "port": port},
        )  # fmt: skip
    return out.text()


def timed(call: Callable[[], object], runs: int) -> tuple[float, object]:
    """The median wall time of `runs` calls, in seconds, and the last call's result."""
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def written(plan: Plan, folder: Path, name: str, runs: int) -> tuple[float, int]:
    path = folder / name
    took, _ = timed(partial(write_plan, plan, path), runs)
    return took, path.stat().st_size


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# .venv/bin/python -m bench.rollout_plan --runs {args.runs}   (make bench), at "
        f"{commit()}, {now}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "SIMULATED fleets; every deployment selected (restart), --allow-standby; times are "
        f"medians of {args.runs} runs",
        "",
        f"{'deployments':>11} {'K':>2} {'plan ms':>9} {'waves':>6} {'planned':>8} "
        f"{'standbys':>8} {'check ms':>9} {'JSON ms':>8} {'JSON KiB':>9} {'TOML ms':>8} "
        f"{'TOML KiB':>9} {'parse fleet ms':>15}",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        for size in SIZES:
            text = fleet_toml(size)
            parse_s, parsed = timed(partial(parse_fleet, text, Path("fleet.toml")), 1)
            assert isinstance(parsed, Fleet)
            fleet = parsed
            models = [m.name for m in fleet.models]
            for width in WIDTHS:
                ask = Ask("restart", models=models, max_unavailable=width, allow_standby=True)
                plan_s, plan = timed(partial(make_plan, fleet, ask), args.runs)
                assert isinstance(plan, Plan)
                check_s, problems = timed(partial(check_plan, plan, fleet), args.runs)
                assert problems == [], problems
                waves, planned, _ = counts(plan)
                standbys = sum(s.operation == "start-standby" for w in plan.waves for s in w.steps)
                assert planned == size
                json_s, json_bytes = written(plan, Path(tmp), "plan.json", args.runs)
                toml_s, toml_bytes = written(plan, Path(tmp), "plan.toml", args.runs)
                row = (
                    f"{size:>11,} {width:>2} {plan_s * 1e3:>9.1f} {waves:>6} {planned:>8,} "
                    f"{standbys:>8} {check_s * 1e3:>9.1f} {json_s * 1e3:>8.1f} "
                    f"{json_bytes / 1024:>9.0f} {toml_s * 1e3:>8.1f} {toml_bytes / 1024:>9.0f} "
                    f"{parse_s * 1e3:>15.0f}"
                )
                print(row, flush=True)
                lines.append(row)
    lines += [
        "",
        "waves: a model's canary wave, then max_unavailable (K) of its deployments at a time,",
        "the models side by side, so the plan has as many waves as its longest model: 16",
        "deployments, 16 waves at K 1 and 1 + 8 at K 2. A model with a standby takes one wave",
        "more (the standby's start); here those have 2 deployments. plan ms is make_plan on",
        "the parsed fleet; parse fleet ms is reading fleet.toml (once, before it).",
    ]
    if not args.no_write:
        OUT.write_text("\n".join(lines) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
