"""The diagnoses judged at the gateway (issue 30), each made on real parts behind the real
gateway, found, moved through the gateway and verified resolved:

- KV-cache pressure: a vLLM with a cache of 384 tokens under six clients of 200;
- a replica imbalance: two real vLLMs, one's EngineCore stopped in bursts;
- an error burst: an engine double that answers 500, beside the session's vLLM.

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
    send_traffic_vllm,
    start_vllm,
    stop,
    wait_until,
)
from tests.support.dataplanes import second_vllm
from tests.support.fleet import deployment, fleet_model, one_node_fleet
from tests.test_diagnoses import agent_over, engine_core, look, stop_in_bursts, until_resolved
from tests.test_gateway import ADMIN, Gateway, nice_group, start_gateway

pytestmark = pytest.mark.engines


@pytest.fixture
def second(request, tiny_model_dir: Path, tmp_path_factory) -> VllmServer:
    return second_vllm(request.config, tiny_model_dir, tmp_path_factory.getbasetemp())


def gateway_fleet(name: str, gw_port: int, state: Path, *pair: dict, **agent: object) -> str:
    """One node's agent and the gateway before `pair`, the deployments of `tiny`; a planned
    failover verifies over 1 s."""
    failover = {"steps": [100], "verify_s": 1, "warmup_requests": 1, "drain_timeout_s": 60}
    return one_node_fleet(
        name,
        fleet_model("tiny", *pair, failover=failover),
        agent={"scrape_interval_s": 1, "window_s": 10, "probe_timeout_s": 5.0, **agent},
        gateway={
            "url": f"http://127.0.0.1:{gw_port}",
            "state_dir": state,
            "health_interval_s": 0.5,
        },
    )


def gateway_over(agent, gw_port: int, monkeypatch: pytest.MonkeyPatch) -> Gateway:
    """The real gateway on the agent's fleet file; this process reads its snapshot (the
    gateway's TTFT and errors) as a console does, with its token."""
    gateway = start_gateway(agent.fleet.parent, "", gw_port)
    monkeypatch.setenv("ENGINEROOM_ADMIN_TOKEN", ADMIN)
    return gateway


def behind_gateway(
    agent_factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, *pair: dict
) -> tuple[Agent, Gateway]:
    """A real agent and the real gateway on one fleet of `tiny`'s deployments `pair`."""
    gw_port = free_port()
    text = gateway_fleet(name, gw_port, tmp_path / "gw-state", *pair)
    agent = agent_over(agent_factory, text, monkeypatch)
    return agent, gateway_over(agent, gw_port, monkeypatch)


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
