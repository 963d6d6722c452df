"""A rolling restart on real engines (issue 31): two real vLLMs started by a real agent,
behind the real gateway (the built-in data plane), under open-loop streaming clients.
`engineroom rollout plan --restart --model tiny` then `engineroom rollout run --wait`,
`--runs` times in a row.

Reported: each rollout's wall time (and the median), the client requests that failed or
were cut during the rollouts (target 0), the fewest deployments that were up with weight
over 0 at any read of the gateway's routes every 0.2 s (target: never under 1), and the
drain step of each drain job (weight 0 to nothing in flight, the failover job's own
timing), on the data plane asked for: the built-in gateway (the clients go through the
gateway), HAProxy (the clients go through HAProxy's front end; the gateway drives its
runtime API and is out of the traffic's path), or the vLLM router (the clients go through
the router; the gateway adds and removes its workers).

  python -m bench.rollout_run [--runs 3] [--dataplane gateway|haproxy|router]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.diagnose_quiet import FLEET, PROFILE, ROOT, Agent, say
from bench.incident_drill import Load
from bench.realfleet import HEADERS, bench_env, start_agent_and_gateway, stop_all
from tests.engines import servers
from tests.support.haproxy import on_haproxy, on_plane

# Each vLLM on a core of its own and at nice 19, as tests/test_rollout_run.py runs them:
# with the OpenMP binding alone (bench.diagnose_quiet's profile), a restart beside the other
# vLLM serving streams did not finish loading in 600 s here, and the rollout halted.
PINNED = PROFILE.replace(
    'command = ["{python}"', 'command = ["taskset", "-c", "{core}", "nice", "-n", "19", "{python}"'
)
# The vLLM router as the model's data plane (docs/dataplanes.md): the gateway adds and
# removes its workers; the router has no weights, so a drain removes the worker.
ROUTER = """
[[dataplanes]]
name = "edge"
kind = "vllm-router"
url = "http://127.0.0.1:{front}"
metrics_url = "http://127.0.0.1:{metrics}/metrics"
"""


def router_argv(front: int, metrics: int, workers: list[str]) -> list[str]:
    binary = os.environ.get("ENGINEROOM_VLLM_ROUTER") or str(
        ROOT / ".engines" / "router" / "bin" / "vllm-router"
    )
    return [
        binary, "--host", "127.0.0.1", "--port", str(front), "--policy", "round_robin",
        "--worker-urls", *workers, "--prometheus-host", "127.0.0.1", "--prometheus-port",
        str(metrics), "--worker-startup-timeout-secs", "600", "--log-level", "warning",
    ]  # fmt: skip


class ReadyWatch(threading.Thread):
    """The fewest of tiny's deployments up with weight > 0 at any read of the routes."""

    def __init__(self, gw: str) -> None:
        super().__init__(daemon=True)
        self.gw = gw
        self.fewest: int | None = None
        self.reads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                routes = httpx.get(self.gw + "/admin/routes", headers=HEADERS, timeout=5).json()
                ready = sum(1 for d in routes["tiny"]["deployments"] if d["up"] and d["weight"])
                self.fewest = ready if self.fewest is None else min(self.fewest, ready)
                self.reads += 1


def cli(env: dict[str, str], *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dataplane", choices=("gateway", "haproxy", "router"), default="gateway")
    args = parser.parse_args()
    runs, dataplane = args.runs, args.dataplane
    walls: list[float] = []
    drains: list[float] = []
    statuses: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        work = Path(tmp)
        model = servers.make_tiny_model(work / "model")
        agent_port, gw_port = servers.free_port(), servers.free_port()
        a_port, b_port = servers.free_port(), servers.free_port()
        profiles = "".join(
            PINNED.format(name=n, model=model, port=p, python=servers.vllm_python(), core=c)
            for n, p, c in (("a", a_port, 0), ("b", b_port, 1))
        )
        fleet = work / "fleet.toml"
        text = FLEET.format(
            state=work / "state", gw_state=work / "gw-state", gw_port=gw_port,
            agent_port=agent_port, a_port=a_port, b_port=b_port, profiles=profiles,
        )  # fmt: skip
        front, metrics = servers.free_port(), servers.free_port()
        if dataplane == "haproxy":
            text = on_haproxy(text, work, front)
        elif dataplane == "router":
            text = on_plane(text, ROUTER.format(front=front, metrics=metrics))
        fleet.write_text(text)
        env = bench_env()
        gw = f"http://127.0.0.1:{gw_port}"
        agent = Agent(f"http://127.0.0.1:{agent_port}")
        procs: list[subprocess.Popen[bytes]] = []
        entry = gw  # where the clients go
        if dataplane == "haproxy":
            rendered = cli(env, "haproxy", "render", "--fleet", str(fleet), timeout=60)
            assert rendered.returncode == 0, rendered.stderr
            with (work / "haproxy.log").open("wb") as log:
                procs.append(subprocess.Popen(["haproxy", "-db", "-f", str(work / "haproxy.cfg")],
                                              stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
            entry = f"http://127.0.0.1:{front}"
        if dataplane == "router":  # it waits for its workers, which start below
            workers = [f"http://127.0.0.1:{p}" for p in (a_port, b_port)]
            with (work / "router.log").open("wb") as log:
                procs.append(subprocess.Popen(router_argv(front, metrics, workers), stdout=log,
                                              stderr=subprocess.STDOUT, cwd=work))  # fmt: skip
            entry = f"http://127.0.0.1:{front}"
        load, watch = None, ReadyWatch(gw)
        in_rollouts: list[tuple[float, float]] = []
        try:
            procs += start_agent_and_gateway(work, fleet, agent_port, gw_port, env)
            for name in ("a", "b"):
                job = agent.job({"kind": "vllm.start", "profile": name})
                say(f"cold start {name}: {job['state']}")
            servers.wait_until(
                lambda: all(d["up"] for d in httpx.get(gw + "/admin/routes", headers=HEADERS,
                                                       timeout=5).json()["tiny"]["deployments"]),
                60, what="both up at the gateway",
            )  # fmt: skip
            load = Load(entry).start()
            watch.start()
            plan = work / "plan.json"
            made = cli(env, "rollout", "plan", "--restart", "--model", "tiny", "--out", str(plan),
                       "--fleet", str(fleet))  # fmt: skip
            assert made.returncode == 0, made.stderr
            for n in range(runs):
                began = time.monotonic()
                run = cli(env, "rollout", "run", str(plan), "--wait", "--why", f"bench {n + 1}",
                          "--fleet", str(fleet))  # fmt: skip
                ended = time.monotonic()
                in_rollouts.append((began, ended))
                if not run.stdout.startswith("rollout "):
                    say(f"rollout {n + 1} did not start: {run.stderr.strip()}")
                    break
                rollout_id = run.stdout.split()[1]
                record = httpx.get(f"{gw}/admin/rollouts/{rollout_id}", headers=HEADERS,
                                   timeout=10).json()  # fmt: skip
                statuses.append(record["status"])
                walls.append(ended - began)
                for step in record["steps"]:
                    for job_id in step["failover_jobs"]:
                        job = httpx.get(f"{gw}/admin/jobs/{job_id}", headers=HEADERS,
                                        timeout=10).json()  # fmt: skip
                        if job["kind"].startswith("drain") and "drain_s" in (
                            job.get("timings") or {}
                        ):
                            drains.append(job["timings"]["drain_s"])
                say(f"rollout {n + 1}: {record['status']} in {ended - began:.1f} s"
                    + (f" ({record['error']})" if record.get("error") else ""))  # fmt: skip
        finally:
            watch.stop.set()
            if load is not None:
                load.finish()
            for name in ("a", "b"):  # the engines the agent started outlive it: stop them
                with contextlib.suppress(Exception):
                    agent.job({"kind": "engine.stop", "engine": agent.engine_of(name)}, 120)
            stop_all(procs[::-1], grace=60)  # the gateway and the agent first
    done = load.done if load else []
    during = [x for x in done if any(b <= x[1] <= e for b, e in in_rollouts)]
    failed = [x for x in during if x[2]]
    drained = "none measured"
    if drains:
        drained = (f"median {statistics.median(drains) * 1000:.0f} ms, "
                   f"max {max(drains) * 1000:.0f} ms over {len(drains)} drains")  # fmt: skip
    plane = {"haproxy": "HAProxy", "router": "the vLLM router"}.get(
        dataplane, "the built-in gateway"
    )
    print(
        f"rolling restart of 2 real vLLMs (a real agent, the real gateway, data plane {plane}) "
        f"under open-loop streaming load through it, {runs} rollout(s) in a row\n"
        f"  states: {', '.join(statuses)}\n"
        f"  wall time per rollout: {', '.join(f'{w:.1f}' for w in walls)} s; "
        f"median {statistics.median(walls):.1f} s\n"
        f"  client requests ending during the rollouts: {len(during)}, failed or cut "
        f"{len(failed)} (target 0)"
        + "".join(f"\n    {x[2]}" for x in failed[:5])
        + f"\n  fewest deployments up with weight > 0 over {watch.reads} reads of the routes: "
        f"{watch.fewest} (target >= 1)\n"
        f"  drain step (weight 0 to nothing in flight, {plane}): {drained}"
    )
    return 0 if statuses and all(s == "succeeded" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
