"""The diagnoses whose first move is made at the gateway (issue 30), each made on real
parts behind the real gateway, found, moved through the gateway and verified resolved:

- KV-cache pressure: a vLLM with a cache of 384 tokens under six clients of 200;
- a replica imbalance: two real vLLMs, one's EngineCore stopped in bursts;
- an error burst: an engine double that answers 500, beside the session's vLLM;
- a Triton stall: a real Triton whose model's one instance blocks, beside the session's vLLM;
- a crash loop: a real vLLM killed again and again, beside the session's vLLM.

The two real vLLMs are the session's ("a") and the data-plane tests' second one ("b",
tests.support.dataplanes.second_vllm): no vLLM boots here if "b" is still up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from console.collect.diagnose.diagnoser import Diagnoser, Diagnosis
from console.collect.views.check import poll_once
from console.core import diagnosis as d
from console.core.config.load import load_fleet
from tests.conftest import ROOT, Agent
from tests.engines.servers import (
    VllmServer,
    distinct_prompt,
    free_port,
    kill,
    launch_vllm,
    send_traffic_triton,
    send_traffic_vllm,
    start_vllm,
    stop,
    wait_until,
)
from tests.engines.triton_repo import write_repo
from tests.support.dataplanes import second_vllm
from tests.support.fleet import deployment, fleet_model, one_node_fleet, triton_ensemble
from tests.test_agent_real_engines import by_deployment
from tests.test_diagnoses import (
    agent_over,
    diagnosed_by_cli,
    engine_core,
    look,
    stop_in_bursts,
    until_resolved,
)
from tests.test_gateway import ADMIN, Gateway, nice_group, start_gateway

pytestmark = pytest.mark.engines


@pytest.fixture
def second(request, tiny_model_dir: Path, tmp_path_factory) -> VllmServer:
    return second_vllm(request.config, tiny_model_dir, tmp_path_factory.getbasetemp())


def gateway_fleet(name: str, gw_port: int, state: Path, *pair: dict, **sections: object) -> str:
    """One node's agent and the gateway before `pair`, the deployments of `tiny`; a planned
    failover verifies over 1 s. `sections`: more tables ([diagnoses], ...)."""
    failover = {"steps": [100], "verify_s": 1, "warmup_requests": 1, "drain_timeout_s": 60}
    return one_node_fleet(
        name,
        fleet_model("tiny", *pair, failover=failover),
        agent={"scrape_interval_s": 1, "window_s": 10, "probe_timeout_s": 5.0},
        gateway={
            "url": f"http://127.0.0.1:{gw_port}",
            "state_dir": state,
            "health_interval_s": 0.5,
        },
        **sections,
    )


def gateway_over(
    agent, gw_port: int, monkeypatch: pytest.MonkeyPatch, healthy: bool = True
) -> Gateway:
    """The real gateway on the agent's fleet file; this process reads its snapshot (the
    gateway's TTFT and errors) as a console does, with its token. `healthy`: wait until
    every deployment is up."""
    gateway = start_gateway(agent.fleet.parent, "", gw_port, healthy=healthy)
    monkeypatch.setenv("ENGINEROOM_ADMIN_TOKEN", ADMIN)
    return gateway


def behind_gateway(
    agent_factory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    *pair: dict,
    discover: bool = False,
    healthy: bool = True,
    **sections: object,
) -> tuple[Agent, Gateway]:
    """A real agent and the real gateway on one fleet of `tiny`'s deployments `pair`."""
    gw_port = free_port()
    text = gateway_fleet(name, gw_port, tmp_path / "gw-state", *pair, **sections)
    agent = agent_over(agent_factory, text, monkeypatch, discover=discover)
    return agent, gateway_over(agent, gw_port, monkeypatch, healthy)


def served_by(id: str, server: VllmServer, weight: int) -> dict:
    return {"id": id, "node": "local", "engine": "vllm", "endpoint": server.base_url,
            "weight": weight}  # fmt: skip


def clients(
    n: int, send: Callable[[], bool], done: threading.Event, failed: list[float]
) -> list[threading.Thread]:
    """`n` threads sending one request after another until `done`; a failure's time in
    `failed`."""

    def loop() -> None:
        while not done.is_set():
            if not send():
                failed.append(time.monotonic())

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    return threads


def first_found(
    fleet: Path, kind: d.DiagnosisDef, timeout: float, what: str
) -> tuple[Diagnosis, Diagnoser]:
    """The first diagnosis of `kind`, as a console starting at each look would raise it
    (a held class is raised at a console's first look, as an alert active at start); the
    Diagnoser that found it, to verify the move with."""
    parsed = load_fleet(fleet)
    found: list[tuple[Diagnosis, Diagnoser]] = []

    def seen() -> bool:
        diagnoser = Diagnoser(parsed)
        hit = next((x for x in look(fleet, diagnoser) if x.kind is kind), None)
        if hit is not None:
            found.append((hit, diagnoser))
        return hit is not None

    try:
        wait_until(seen, timeout, interval=1.0, what=what)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout:g} s; {figures(fleet)}") from None
    return found[0]


def figures(fleet: Path) -> str:
    """What the class's inputs read at a look: each deployment's TTFT p95 at the engine and
    at the gateway, and its API server's CPU."""
    parsed = load_fleet(fleet)
    view, states, gateway, _ = asyncio.run(poll_once(parsed))
    cpu = {e.id: e.api_server_cpu_pct for s in states.values() if s.snapshot
           for e in s.snapshot.engines}  # fmt: skip
    out = []
    for row in view.models.get("tiny", []):
        at = gateway.snapshot.at("tiny", row.id) if gateway.snapshot else None
        engine = row.stats.latency.ttft_s.p95 if row.stats else None
        client = at.ttft_p95 if at else None
        out.append(f"{row.id}: TTFT p95 engine {engine}, gateway {client}; "
                   f"API server CPU {cpu.get(row.engine_id)}")  # fmt: skip
    return "; ".join(out)


def served_count(fleet: Path, deployment: str) -> int:
    """The requests the gateway has passed to `deployment` in its window, as a console reads
    them (0 where it has none to count)."""
    _, _, gateway, _ = asyncio.run(poll_once(load_fleet(fleet)))
    at = gateway.snapshot.at("tiny", deployment) if gateway.snapshot else None
    return (at.requests or 0) if at is not None else 0


def move(gateway: Gateway, diagnoser: Diagnoser, found: Diagnosis, name: str, **body: str) -> float:
    """The move `name` through the gateway's admin API, as the console's plan screen makes
    it; when it was made. The job must succeed."""
    answer = gateway.admin(
        "POST", "/admin/failover", json={"model": "tiny", "mode": "planned", **body}
    )
    assert answer.status_code == 202, answer.text
    moved_at = time.monotonic()
    diagnoser.moved(found.key, name)  # type: ignore[arg-type]
    job = gateway.wait_job(answer.json()["id"], timeout=180)
    assert job["state"] == "succeeded", (job.get("error"), job.get("steps"))
    return moved_at


# -- KV-cache pressure -----------------------------------------------------------------


def test_a_vllm_out_of_kv_cache_preempting_is_kv_pressure_resolved_once_failed_over(
    agent_factory, vllm_server: VllmServer, tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    """Real vLLM ("kv", weight 100) with 12 KV blocks of 32 tokens (384 tokens), and six
    clients of ~200 tokens each through the real gateway: its cache fills and it preempts.
    Named KV-cache pressure on that engine, with the usage and the preemptions as evidence,
    a standby first. Failed over to the session's vLLM through the gateway, the preemptions
    leave the agent's window: resolved."""
    kv = start_vllm(
        tiny_model_dir, tmp_path / "vllm",
        extra_args=("-O0", "--block-size", "32", "--num-gpu-blocks-override", "12"),
    )  # fmt: skip
    done, failed = threading.Event(), []
    threads: list[threading.Thread] = []
    gateway = None
    try:
        agent, gateway = behind_gateway(
            agent_factory, monkeypatch, tmp_path, "kv",
            served_by("tiny-kv", kv, 100), served_by("tiny-vllm", vllm_server, 0),
        )  # fmt: skip
        url = gateway.url
        threads = clients(
            6, lambda: send_traffic_vllm(url, 1, True, max_tokens=200, timeout=300,
                                         prompts=distinct_prompt) == 1,
            done, failed,
        )  # fmt: skip
        found, diagnoser = first_found(agent.fleet, d.KV_PRESSURE, 120, "KV pressure diagnosed")
        engine = next(e for e in agent.snapshot()["engines"] if "tiny-kv" in e["deployment_ids"])
        assert found.subject == f"local/{engine['id']}" and found.moves[0] == "standby"
        shown = {e.figure: e.value for e in found.evidence}
        # Its KV gauge at or over 0.9, or a preemption storm: a scrape often reads the
        # gauges between batches, at 0 (docs/diagnoses.md, kv_pressure).
        full = shown["KV cache"] != "?" and int(shown["KV cache"].rstrip("%")) >= 90
        storm = shown["preemptions"] != "?" and float(shown["preemptions"][:-2]) >= 0.5
        assert full or storm, shown
        assert shown["preemptions"] != "?" or shown["waiting for capacity"] != "?", shown
        moved_at = move(gateway, diagnoser, found, "failover", to="tiny-vllm")
        until_resolved(agent.fleet, diagnoser, found.key, "failover", 60,
                       what="KV pressure resolved once failed over")  # fmt: skip
        assert [t for t in failed if t >= moved_at] == [], failed
    finally:
        done.set()
        for thread in threads:
            thread.join(300)
        if gateway is not None:
            stop(gateway.process, grace=5)
        kill(kv.process)


# -- a replica imbalance ---------------------------------------------------------------


def test_a_replica_slowed_by_stop_bursts_is_an_imbalance_resolved_once_quarantined(
    agent_factory, vllm_server: VllmServer, second: VllmServer, tmp_path: Path, monkeypatch
):
    """Two real vLLMs serve `tiny` at weight 50 each behind the real gateway, under
    streaming clients. One's ("b") EngineCore is stopped for 0.3 s of every 0.6 s (SIGSTOP
    bursts): its TTFT and ITL p95 rise far over its sibling's. Named a replica imbalance on
    that deployment, quarantine first; quarantined through the gateway (a planned drain to
    weight 0), it reads resolved, and the clients never saw a failure."""
    done, failed = threading.Event(), []
    core: psutil.Process | None = None
    gateway = None
    senders: list[threading.Thread] = []
    try:
        agent, gateway = behind_gateway(
            agent_factory, monkeypatch, tmp_path, "imbalance",
            served_by("tiny-vllm", vllm_server, 50), served_by("tiny-slow", second, 50),
        )  # fmt: skip
        for server in (vllm_server, second):
            nice_group(server.process.pid)  # the gateway keeps its health checks
        url = gateway.url
        senders = clients(
            3, lambda: send_traffic_vllm(url, 1, True, max_tokens=32, timeout=120) == 1,
            done, failed,
        )  # fmt: skip
        core = engine_core(second.process.pid)
        senders.append(stop_in_bursts(core, done, 0.3, 0.3))  # 0.3 s stopped in every 0.6 s
        found, diagnoser = first_found(
            agent.fleet, d.REPLICA_IMBALANCE, 120, "replica imbalance diagnosed"
        )
        assert found.subject == "tiny/tiny-slow" and found.deployment == "tiny-slow", found
        assert found.moves[0] == "quarantine", found.moves
        shown = {e.figure: e.value for e in found.evidence}
        assert any(f.endswith("p95") and not f.startswith("siblings") for f in shown), shown
        moved_at = move(gateway, diagnoser, found, "quarantine", drain="tiny-slow")
        until_resolved(
            agent.fleet, diagnoser, found.key, "quarantine", 60, what="resolved once quarantined"
        )
        assert [t for t in failed if t >= moved_at] == [], failed  # no client failed after it
    finally:
        done.set()
        if core is not None:
            with contextlib.suppress(psutil.Error):
                core.resume()
        for thread in senders:
            thread.join(150)
        if gateway is not None:
            stop(gateway.process, grace=5)


# -- an error burst: an engine double that fails its requests --------------------------


def test_an_engine_that_fails_its_requests_is_an_error_burst_resolved_once_failed_over(
    agent_factory, vllm_server: VllmServer, tmp_path: Path, monkeypatch
):
    """The engine answers its health checks and 500 to every completion (the hostile
    engine's completion-500: a TEST DOUBLE of a broken engine, which no real one can be
    made here on demand), beside the session's vLLM at weight 0; clients go through the real
    gateway, which counts the failures. Named an error burst on the double's deployment,
    with the gateway's count; failed over to the real vLLM through the gateway, resolved."""
    bad_port = free_port()
    double = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "hostile_engine.py"), f"completion-500:{bad_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    gateway = None
    try:
        assert double.stdout is not None and double.stdout.readline() == b"listening\n"
        agent, gateway = behind_gateway(
            agent_factory, monkeypatch, tmp_path, "burst",
            deployment("tiny-bad", "local", "vllm", bad_port, weight=100),
            served_by("tiny-vllm", vllm_server, 0),
        )  # fmt: skip
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        codes = [
            httpx.post(gateway.url + "/v1/completions", json=body, timeout=30).status_code
            for _ in range(10)
        ]
        assert all(code >= 500 for code in codes), codes
        found, diagnoser = first_found(agent.fleet, d.ERROR_BURST, 30, "the error burst diagnosed")
        assert found.subject == "tiny/tiny-bad" and found.moves[0] == "failover"
        rate, counted = found.evidence[0], found.evidence[1]
        assert rate.at == "gateway" and rate.value.startswith("100.0%"), rate
        # Every request the gateway passed to it failed (after a few, the gateway's own
        # health marks it down and answers the rest itself: those are not its).
        failed, _, passed = counted.value.partition(" failed of ")
        assert counted.at == "gateway" and failed == passed and int(passed) >= 1, counted
        move(gateway, diagnoser, found, "failover", to="tiny-vllm")
        until_resolved(agent.fleet, diagnoser, found.key, "failover", 30,
                       what="the error burst resolved once failed over")  # fmt: skip
        answer = httpx.post(gateway.url + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text  # the real vLLM answers now
    finally:
        if gateway is not None:
            stop(gateway.process, grace=5)
        os.killpg(double.pid, signal.SIGKILL)
        double.wait(10)


# -- a Triton stall --------------------------------------------------------------------


def test_a_triton_model_that_blocks_is_a_triton_stall_failed_over_and_resolved(
    agent_factory, engine_launcher, vllm_server: VllmServer, tmp_path: Path, monkeypatch
):
    """Real Triton ("tiny-trt", weight 100), one model instance that takes 18 s a request
    (the Python-backend TEST DOUBLE of the ensemble, 30 tokens 0.6 s apart): a second
    request waits in Triton's queue while nothing finishes. Triton still answers its health
    checks. Named on its engine, failover first (3 s after the queue formed). The move and
    the next request take about 5 s of the 15 left before the first request ends.
    Failed over through the real gateway to the session's vLLM, which answers the next
    request while Triton is still stuck; once its first request finishes and nothing is
    queued, resolved."""
    repo = write_repo(tmp_path / "repo", "ensemble", token_delay_ms=600, instances=1)
    triton = engine_launcher.triton(repo)
    trt = triton_ensemble("tiny-trt", "local", triton.http_port, triton.metrics_port)
    gateway = None
    try:
        agent, gateway = behind_gateway(
            agent_factory, monkeypatch, tmp_path, "stall",
            {**trt, "weight": 100}, served_by("tiny-vllm", vllm_server, 0),
            diagnoses={"triton_stall_after_s": 3},
        )  # fmt: skip
        engine = wait_until(
            lambda: (e := by_deployment(agent).get("tiny-trt", {})).get("state") == "ready" and e,
            30,
            what="Triton ready in the snapshot",
        )
        diagnoser = Diagnoser(load_fleet(agent.fleet))
        assert look(agent.fleet, diagnoser) == []  # at rest: nothing

        def ask() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server stops at teardown
                send_traffic_triton(triton.base_url, "ensemble", 1, False, 30, timeout=120)

        for _ in range(2):  # one runs in the model's one instance; the other waits queued
            threading.Thread(target=ask, daemon=True).start()
        queued = time.monotonic()

        def stalled() -> Diagnosis | None:
            return next((x for x in look(agent.fleet, diagnoser) if x.kind is d.TRITON_STALL), None)

        found = wait_until(stalled, 60, interval=0.5, what="Triton stall diagnosed")
        print(f"Triton stall: diagnosed {time.monotonic() - queued:.1f} s after a request queued")
        assert found.subject == f"local/{engine['id']}" and found.engine == engine["id"]
        assert found.moves[0] == "failover" and found.deployment == "tiny-trt"
        shown = {e.figure: e.value for e in found.evidence}
        assert shown["requests pending"] == "1", shown
        assert shown["health"].startswith("ready"), shown  # Triton still answers
        assert "triton_stall" in diagnosed_by_cli(agent.fleet)
        move(gateway, diagnoser, found, "failover", to="tiny-vllm")
        before = served_count(agent.fleet, "tiny-vllm")
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        answer = httpx.post(gateway.url + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert served_count(agent.fleet, "tiny-vllm") > before  # vLLM answered it
        stuck = next(x for x in look(agent.fleet, diagnoser) if x.key == found.key)
        assert stuck.state == "verifying", stuck.detail  # Triton's queue is still there
        # The first request finishes at 18 s; the second runs and nothing is queued.
        until_resolved(agent.fleet, diagnoser, found.key, "failover", 60,
                       what="the Triton stall resolved once a request finished")  # fmt: skip
    finally:
        if gateway is not None:
            stop(gateway.process, grace=5)


# -- a crash loop ----------------------------------------------------------------------


def test_a_vllm_killed_again_and_again_is_a_crash_loop_failed_over_and_resolved(
    agent_factory, vllm_server: VllmServer, tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    """A real vLLM ("tiny-vllm", weight 100), killed (SIGKILL to its process group) each
    time the agent has found it, and started again on its port as systemd's Restart= would:
    three exits no one asked for within the window are a crash loop on its engine, failover
    first. Failed over through the real gateway to the session's vLLM, which answers; started
    once more and left alone, it is resolved once its exits leave the window. An exit the
    agent asked for (a stop job's) is never counted: tests/test_jobs.py's stops run with the
    same watch. Last, that engine, ready, is killed: down within two scrape intervals."""
    port = free_port()
    gateway = None
    running: list[subprocess.Popen[bytes]] = []
    try:
        # Discovery on: the agent finds each new process on the port, as it finds a fleet's.
        agent, gateway = behind_gateway(
            agent_factory, monkeypatch, tmp_path, "crash",
            deployment("tiny-vllm", "local", "vllm", port, weight=100),
            served_by("tiny-a", vllm_server, 0),
            discover=True, healthy=False, diagnoses={"crash_loop_window_s": 40},
        )  # fmt: skip
        diagnoser = Diagnoser(load_fleet(agent.fleet))

        def engine() -> dict:
            return by_deployment(agent)["tiny-vllm"]

        for n in range(1, 4):
            process, _, _ = launch_vllm(tiny_model_dir, tmp_path / "vllm", port=port)
            running.append(process)
            wait_until(lambda p=process: engine()["pid"] == p.pid, 60, what=f"start {n} found")
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
            wait_until(lambda n=n: len(engine()["exits"]) == n, 30, what=f"exit {n} seen")
        crash = wait_until(
            lambda: next(
                (x for x in look(agent.fleet, diagnoser)
                 if x.kind is d.CRASH_LOOP and x.engine == f"vllm-{port}"),
                None,
            ),
            30,
            interval=0.5,
            what="the crash loop diagnosed",
        )  # fmt: skip
        assert crash.subject == f"local/vllm-{port}" and crash.moves[0] == "failover"
        assert crash.cause == "exited 3 times" and crash.deployment == "tiny-vllm"
        assert crash.evidence[0].value.startswith("3 ("), crash.evidence
        assert "crash_loop" in diagnosed_by_cli(agent.fleet)
        move(gateway, diagnoser, crash, "failover", to="tiny-a", mode="emergency")
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        answer = httpx.post(gateway.url + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text  # the session's vLLM answers
        # Started once more (its cause fixed) and left running: no exit for the window.
        process, _, _ = launch_vllm(tiny_model_dir, tmp_path / "vllm", port=port)
        running.append(process)
        wait_until(lambda: engine()["pid"] == process.pid, 60, what="the last start found")
        until_resolved(agent.fleet, diagnoser, crash.key, "failover", 90, interval=1.0,
                       what="the crash loop resolved once its exits left the window")  # fmt: skip
        assert process.poll() is None  # the same process throughout: nothing counted it
        # The agent's liveness on the same engine (before, a vLLM of its own): a ready vLLM
        # killed turns down within two scrape intervals, saying why.
        wait_until(lambda: engine()["state"] == "ready", 60, what="the last start ready")
        os.killpg(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        down = wait_until(
            lambda: (e := engine())["state"] == "down" and e, 10, interval=0.05,
            what="vLLM down in the snapshot",
        )  # fmt: skip
        took = time.monotonic() - killed
        assert took <= 2 * 1.0, f"down after {took:.2f} s"  # the agent's scrape: 1 s
        assert f"process {process.pid} exited" in down["reason"], down
        assert down["models"] == [], down
    finally:
        if gateway is not None:
            stop(gateway.process, grace=5)
        for process in running:
            kill(process)
