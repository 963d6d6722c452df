"""Running a rollout in the gateway (issue 31) on real parts: two real vLLMs started by a
real agent serve one model behind the real gateway, under streaming clients.

One test, because each part costs real engine restarts: a rolling restart, canary first,
with a kill -9 of the gateway while the second deployment's restart runs (the rollout
reads interrupted at its step and phase, the weights read back from the data plane); its
resume finds that deployment slow after its restart (SIGSTOP bursts on its EngineCore),
so it halts with the deployment out of traffic, the other left as it was and the audit
saying why; a second resume, the bursts over, finishes it. Then the same two engines move
behind HAProxy (the clients on its front end, the gateway driving its runtime API) for a
second rollout, a restart of tiny-b alone (one cold start less: the suite's 40 minutes),
whose `rollout run --wait` is killed mid-way (a console losing its connection): the
rollout goes on in the gateway, a new console finds it, and it succeeds.
Throughout, never fewer than one ready deployment carried traffic, and no client request
failed or was cut except while the built-in gateway (in the traffic's path) was down. The
refusals that need no engine are tested apart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from console.core.config.load import parse_fleet
from console.tui.app import EngineroomApp
from console.tui.screens.rollouts import RolloutsScreen
from tests.conftest import OPERATOR, ROOT, agent_env, run_cli
from tests.engines.servers import free_port, send_traffic_vllm, stop, vllm_python, wait_until
from tests.support.fleet import (
    deployment,
    fleet_model,
    one_node_fleet,
    vllm_cpu_args,
    vllm_profile,
)
from tests.support.haproxy import on_haproxy, runtime
from tests.test_agent_real_engines import by_deployment
from tests.test_diagnoses import NODE_TOKEN, agent_over, engine_core, stop_in_bursts
from tests.test_gateway import ADMIN, Gateway, start_gateway
from tests.test_tui_rollouts import shown
from tests.tui_support import until

OPERATOR_TOKEN = OPERATOR.split(":", 1)[1]


def fleet_text(tmp_path: Path, model_dir: Path, gw_port: int, ports: tuple[int, int]) -> str:
    """Each vLLM on a core of its own, at nice 19: on these 2-core machines a vLLM's CPU
    worker binds to core 0 unless told, and one restarted there beside another serving
    streams did not finish loading in 240 s (it loaded once the streams stopped). At nice 19
    the gateway, the agent and the clients keep their turns."""
    profiles, deployments = {}, []
    for core, (name, port) in enumerate(zip("ab", ports, strict=True)):
        profile = vllm_profile(
            "local", model_dir, port, vllm_python(), args=vllm_cpu_args(512),
            env={"VLLM_CPU_KVCACHE_SPACE": "1"}, ready_timeout_s=240, stop_grace_s=10,
        )  # fmt: skip
        profile["command"] = ["taskset", "-c", str(core), "nice", "-n", "19", *profile["command"]]
        profiles[f"tiny-{name}"] = profile
        deployments.append(
            deployment(f"tiny-{name}", "local", "vllm", port, profile=f"tiny-{name}", weight=50)
        )
    failover = {"steps": [100], "verify_s": 3, "warmup_requests": 1, "drain_timeout_s": 60}
    return one_node_fleet(
        "roll",
        fleet_model("tiny", *deployments, failover=failover),
        agent={"state_dir": tmp_path / "agent-state", "scrape_interval_s": 1},
        gateway={
            "url": f"http://127.0.0.1:{gw_port}",
            "state_dir": tmp_path / "gw-state",
            "health_interval_s": 0.5,
        },
        profiles=profiles,
    )


class Clients:
    """Streaming clients through the gateway; each request's end time and whether it was
    answered whole ([DONE] seen)."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.done = threading.Event()
        self.results: list[tuple[float, bool]] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            ok = send_traffic_vllm(self.url, 1, True, max_tokens=16, timeout=120) == 1
            self.results.append((time.monotonic(), ok))

    def failed(self, outside: tuple[float, float] | None = None) -> list[float]:
        return [t for t, ok in self.results
                if not ok and not (outside and outside[0] <= t <= outside[1])]  # fmt: skip

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(150)


class ReadyWatch:
    """The fewest deployments of tiny that were up with weight > 0 at any read of the
    gateway's routes (reads while the gateway is down are skipped)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.fewest: int | None = None
        self.lowest: list[dict] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.2):
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                deps = self.gateway.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
                ready = sum(1 for d in deps if d["up"] and d["weight"] > 0)
                if self.fewest is None or ready < self.fewest:
                    self.fewest, self.lowest = ready, deps  # what the fewest was, and why

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)


def rollout(gateway: Gateway, rollout_id: str) -> dict:
    answer = gateway.admin("GET", f"/admin/rollouts/{rollout_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def until_status(gateway: Gateway, rollout_id: str, timeout: float) -> dict:
    return wait_until(
        lambda: (r := rollout(gateway, rollout_id))["status"] != "running" and r,
        timeout, interval=0.5, what=f"rollout {rollout_id} no longer running",
    )  # fmt: skip


def weights(gateway: Gateway) -> dict[str, int]:
    deps = gateway.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
    return {d["id"]: d["weight"] for d in deps}


def started_id(out: str) -> str:
    return out.split()[1]  # "rollout ID started: ..."


def start_haproxy(fleet: Path, sock: Path) -> subprocess.Popen[bytes]:
    """`engineroom haproxy render`, then HAProxy on that file, its two servers up."""
    rendered = run_cli("haproxy", "render", "--fleet", str(fleet), env=agent_env())
    assert rendered.returncode == 0, rendered.stderr
    log = fleet.parent / "haproxy.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["haproxy", "-db", "-f", str(fleet.parent / "haproxy.cfg")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"haproxy exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            stat = runtime(sock, "show stat be_tiny 4 -1")
            return stat.count(",UP,") == 2
        return False

    wait_until(up, 20, what="HAProxy and its two servers up")
    return process


async def a_new_console_finds(fleet: Path, rollout_id: str) -> str:
    """A console started now, on the Rollouts screen: the rollout as it shows it."""
    app = EngineroomApp(parse_fleet(fleet.read_text()))
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen), what="Rollouts")
        try:
            return await until(pilot, lambda: rollout_id in shown(app) and shown(app), 30,
                               what="the rollout on a new console")  # fmt: skip
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen: {shown(app)}") from None


@pytest.mark.engines
@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy: make haproxy")
@pytest.mark.timeout(1200)  # two vLLMs start, then each restarts, on a shared 2-core machine
def test_rolling_restarts_survive_a_gateway_kill_halt_when_slow_and_run_behind_haproxy(
    agent_factory, tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    gw_port, ports = free_port(), (free_port(), free_port())
    agent = agent_over(
        agent_factory, fleet_text(tmp_path, tiny_model_dir, gw_port, ports), monkeypatch
    )
    fleet = str(agent.fleet)
    env = agent_env(**{NODE_TOKEN: OPERATOR_TOKEN, "ENGINEROOM_ADMIN_TOKEN": ADMIN})
    starts = [
        threading.Thread(target=lambda n=n: run_cli(
            "vllm", "start", "--fleet", fleet, "--node", "local", "--profile", f"tiny-{n}",
            "--wait", env=env, timeout=300))
        for n in "ab"
    ]  # fmt: skip
    for thread in starts:
        thread.start()
    for thread in starts:
        thread.join(310)
    engines = wait_until(
        lambda: (e := by_deployment(agent)).keys() >= {"tiny-a", "tiny-b"}
        and all(x["state"] == "ready" for x in e.values()) and e,
        60, what="both vLLMs ready",
    )  # fmt: skip
    pids = {d: e["pid"] for d, e in engines.items()}
    gateway = start_gateway(agent.fleet.parent, "", gw_port)
    clients = Clients(gateway.url, 1)
    watch = ReadyWatch(gateway)
    core: psutil.Process | None = None
    burst_done = threading.Event()
    haproxy: subprocess.Popen[bytes] | None = None
    console: subprocess.Popen[str] | None = None
    try:
        plan = tmp_path / "restart.json"
        made = run_cli("rollout", "plan", "--restart", "--model", "tiny", "--out", str(plan),
                       "--fleet", fleet, env=env)  # fmt: skip
        assert made.returncode == 0, made.stderr
        run = run_cli("rollout", "run", str(plan), "--why", "vLLM security fix",
                      "--fleet", fleet, env=env)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        first = started_id(run.stdout)

        # kill -9 of the gateway while the second deployment's restart runs on its agent
        wait_until(
            lambda: (r := rollout(gateway, first))["current"] == 1
            and "operation" in r["steps"][1]["agent_jobs"],
            400, interval=0.3, what="the second step's restart asked of the agent",
        )  # fmt: skip
        killed = time.monotonic()
        os.kill(gateway.process.pid, signal.SIGKILL)
        gateway.process.wait(10)
        gateway = start_gateway(agent.fleet.parent, "", gw_port, healthy=False)
        back = time.monotonic()
        watch.gateway = gateway
        interrupted = wait_until(
            lambda: (r := rollout(gateway, first)).get("weights_seen") and r,
            30, what="the weights read back",
        )  # fmt: skip
        assert interrupted["status"] == "interrupted", interrupted
        step = interrupted["steps"][1]
        assert (step["deployment"], step["state"], step["phase"]) == (
            "tiny-b", "interrupted", "operation"), step  # fmt: skip
        routes = gateway.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
        assert interrupted["weights_seen"]["tiny"] == {d["id"]: d["weight"] for d in routes}
        assert interrupted["weights_seen"]["tiny"] == {"tiny-a": 100, "tiny-b": 0}
        shown = run_cli("rollout", "show", first, "--fleet", fleet, env=env)
        assert "interrupted" in shown.stdout and "phase operation" in shown.stdout, shown.stdout
        a_pid = by_deployment(agent)["tiny-a"]["pid"]
        assert a_pid != pids["tiny-a"]  # the canary was restarted first
        resumed = run_cli("rollout", "resume", first, "--why", "gateway back", "--fleet", fleet,
                          env=env)  # fmt: skip
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr

        # tiny-b comes back from its restart slow: the rollout halts before it serves.
        def b_restarted() -> int | None:  # its new engine ready, as its agent reads it
            b = by_deployment(agent).get("tiny-b", {})
            fresh = b.get("pid") not in (None, pids["tiny-b"]) and b.get("state") == "ready"
            return b["pid"] if fresh else None

        new_b = wait_until(b_restarted, 400, interval=0.2, what="tiny-b restarted and ready")
        core = engine_core(new_b)

        burster = stop_in_bursts(core, burst_done, 0.5, 0.1)  # 0.5 s stopped in every 0.6 s
        halted = until_status(gateway, first, 300)
        burst_done.set()
        burster.join(5)
        assert halted["status"] == "halted", halted
        step = halted["steps"][1]
        assert step["deployment"] == "tiny-b" and step["state"] == "halted", step
        assert "TTFT p95" in step["breach"] and "baseline" in step["breach"], step["breach"]
        assert "stays out of traffic" in halted["error"], halted["error"]
        assert weights(gateway) == {"tiny-a": 100, "tiny-b": 0}
        assert by_deployment(agent)["tiny-a"]["pid"] == a_pid  # the other left as it was
        audit = gateway.admin("GET", "/admin/audit").json()
        said = [row for row in audit if row["action"] == "rollout halted"]
        assert said and "TTFT p95" in said[0]["params"]["why"], said

        # The operator looked; the core runs freely again: a resume checks it again.
        resumed = run_cli("rollout", "resume", first, "--why", "noisy neighbour gone",
                          "--fleet", fleet, env=env)  # fmt: skip
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        done = until_status(gateway, first, 300)
        assert done["status"] == "succeeded", done["error"]
        assert [s["deployment"] for s in done["steps"]] == ["tiny-a", "tiny-b"]
        assert done["steps"][0]["canary"] is True
        restarts = [j for j in agent.get("/v1/jobs").json() if j["kind"] == "engine.restart"]
        assert len(restarts) == 2 and all(j["state"] == "succeeded" for j in restarts)
        assert clients.failed(outside=(killed, back)) == []
        assert watch.fewest is not None and watch.fewest >= 1, watch.lowest
        assert weights(gateway) == {"tiny-a": 50, "tiny-b": 50}
        whys = [e["why"] for e in done["events"] if e["what"] == "resumed"]
        assert whys == ["gateway back", "noisy neighbour gone"], done["events"]
        listed = run_cli("rollout", "list", "--fleet", fleet, env=env)
        assert f"{first} succeeded" in " ".join(listed.stdout.split()), listed.stdout

        # Again behind HAProxy: the gateway drives it, the clients use its front end.
        clients.stop()
        watch.stop()
        stop(gateway.process, grace=5)
        front = free_port()
        agent.fleet.write_text(on_haproxy(agent.fleet.read_text(), agent.fleet.parent, front))
        sock = agent.fleet.parent / "admin.sock"
        haproxy = start_haproxy(agent.fleet, sock)
        gateway = start_gateway(agent.fleet.parent, "", gw_port)
        clients, watch = Clients(f"http://127.0.0.1:{front}", 1), ReadyWatch(gateway)
        # A new plan: the old one names the fleet file as it was. tiny-b alone: its drain,
        # restart and return through HAProxy's runtime API are what is new here.
        made = run_cli("rollout", "plan", "--restart", "--deployment", "tiny-b", "--out",
                       str(plan), "--fleet", fleet, env=env)  # fmt: skip
        assert made.returncode == 0, made.stderr
        console = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "rollout", "run", str(plan), "--wait",
             "--why", "vLLM security fix, behind HAProxy", "--fleet", fleet],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        assert console.stdout is not None
        second = started_id(console.stdout.readline())
        wait_until(lambda: rollout(gateway, second)["steps"][0]["phase"] == "operation",
                   120, interval=0.3, what="the canary's restart under way")  # fmt: skip
        console.kill()  # the console that started it loses its connection
        monkeypatch.setenv("ENGINEROOM_ADMIN_TOKEN", ADMIN)  # a new console's gateway token
        console.wait(10)
        assert rollout(gateway, second)["status"] == "running"
        seen = asyncio.run(a_new_console_finds(agent.fleet, second))
        assert "RUNNING" in seen or "SUCCEEDED" in seen, seen
        done = until_status(gateway, second, 400)
        assert done["status"] == "succeeded", done["error"]
        assert [s["deployment"] for s in done["steps"]] == ["tiny-b"]
        restarts = [j for j in agent.get("/v1/jobs").json() if j["kind"] == "engine.restart"]
        assert len(restarts) == 3 and all(j["state"] == "succeeded" for j in restarts)
        clients.stop()
        assert clients.results and clients.failed() == [], clients.failed()
        assert watch.fewest is not None and watch.fewest >= 1, watch.lowest
        assert weights(gateway) == {"tiny-a": 50, "tiny-b": 50}
        stat = runtime(sock, "show stat be_tiny 4 -1")
        assert stat.count(",UP,") == 2, stat
    finally:
        burst_done.set()
        if console is not None and console.poll() is None:
            console.kill()
        if core is not None:
            with contextlib.suppress(psutil.Error):
                core.resume()
        clients.stop()
        watch.stop()
        stop(gateway.process, grace=5)
        if haproxy is not None:
            stop(haproxy, grace=5)
        stops = [  # the engines outlive their agent: stopped through it, side by side
            threading.Thread(target=lambda e=e: run_cli(
                "vllm", "stop", "--fleet", fleet, "--node", "local", "--engine", e, "--wait",
                env=env, timeout=120))
            for e in (f"vllm-{port}" for port in ports)
        ]  # fmt: skip
        for thread in stops:
            thread.start()
        for thread in stops:
            thread.join(130)
        print(json.dumps({"failed": clients.failed(), "requests": len(clients.results)}))
