"""The demo fleet: SIMULATED GPUs and engines, read by the REAL agent over real HTTP."""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

from console.core.config.load import load_fleet
from console.core.wire import Snapshot
from tests.engines.servers import running, wait_until
from tests.sim.conftest import SimFleet, end, start_sim


def standbys(demo: SimFleet) -> set[str]:
    """Deployment ids of the demo's vLLM standbys: declared with weight 0 and a launch
    profile, and down until someone starts them."""
    fleet = load_fleet(demo.fleet)
    return {d.id for m in fleet.models for d in m.deployments if d.weight == 0 and d.profile}


def serving(snap: Snapshot, demo: SimFleet) -> list:
    idle = standbys(demo)
    return [e for e in snap.engines if not set(e.deployment_ids) <= idle]


def test_the_fleet_file_says_simulated_and_declares_the_models(demo):
    fleet = load_fleet(demo.fleet)
    assert "SIMULATED" in fleet.fleet.name
    assert fleet.fleet.environment == "staging"
    assert [n.name for n in fleet.nodes] == ["gpu-a1", "gpu-a2"]
    assert {n.token_env for n in fleet.nodes} == {"ENGINEROOM_DEMO_TOKEN"}
    assert fleet.agent.discover is False
    llama8b = next(m for m in fleet.models if m.name == "llama-3.1-8b-instruct")
    by_engine = {d.engine: d for d in llama8b.deployments if d.weight}
    standby = next(d for d in llama8b.deployments if d.weight == 0)
    assert standby.profile in fleet.profiles and standby.engine == "vllm"
    assert by_engine["triton"].node != by_engine["vllm"].node
    assert by_engine["triton"].engine_model == "ensemble"
    assert len(fleet.models) >= 3
    assert all(m.slo.ttft_p95_ms for m in fleet.models)


def test_every_agent_serves_eight_simulated_gpus(demo):
    for name, snap in demo.snapshots().items():
        assert snap.node.name == name
        assert snap.node.hostname == f"{name}.simulated"
        assert snap.gpu_status == "ok"
        assert snap.driver_version and snap.driver_version.endswith("-sim")
        assert len(snap.gpus) == 8
        for gpu in snap.gpus:
            assert gpu.name == "NVIDIA H200 (SIMULATED)"
            assert gpu.utilization_pct is not None
            assert gpu.memory_total_bytes == 143771 * 2**20
            assert gpu.power_limit_w == 700
            assert gpu.compute_capability == "9.0"
            assert gpu.errors == []
        idle = [g for g in snap.gpus if not g.processes]
        assert idle and all(g.clock_event_reasons == ["idle"] for g in idle)


def test_engines_are_ready_and_their_versions_say_sim(demo):
    for snap in demo.snapshots().values():
        assert snap.engines
        stopped = [e for e in snap.engines if e not in serving(snap, demo)]
        assert all(e.state == "down" for e in stopped)  # standbys, not started
        for engine in serving(snap, demo):
            assert engine.state == "ready", engine
            assert engine.reason is None, engine.reason
            assert engine.version and engine.version.endswith("-sim")
            assert engine.pid is not None and engine.deployment_ids


def test_gpu_processes_map_to_their_engines(demo):
    for snap in demo.snapshots().values():
        engines = {e.id: e for e in serving(snap, demo)}
        gpus_of: dict[str, list[int]] = {}
        for gpu in snap.gpus:
            for proc in gpu.processes or []:
                assert proc.engine_id in engines
                # The engine's process; for an engine its agent started (a launch profile),
                # its child under the agent's log capper, whose pid the engine is known by.
                pid = engines[proc.engine_id].pid
                assert proc.pid == pid or psutil.Process(proc.pid).ppid() == pid
                assert proc.name in ("sim-vllm", "sim-triton", "cat")
                gpus_of.setdefault(proc.engine_id, []).append(gpu.index)
        assert set(gpus_of) == set(engines)  # every engine holds at least one GPU
        assert any(len(g) == 2 for g in gpus_of.values())  # tensor parallel over two


def test_one_gpu_runs_hot_and_one_has_an_uncorrected_ecc_error(demo):
    gpus = [g for snap in demo.snapshots().values() for g in snap.gpus]
    hot = [g for g in gpus if (g.temperature_c or 0) >= 87]
    assert len(hot) == 1
    assert "software thermal slowdown" in (hot[0].clock_event_reasons or [])
    assert len([g for g in gpus if (g.ecc_uncorrected or 0) > 0]) == 1


def test_latency_windows_fill_in_from_the_simulated_traffic(demo):
    def filled() -> dict[str, Snapshot] | None:
        snaps = demo.snapshots()
        for snap in snaps.values():
            for engine in snap.engines:
                for model in engine.models:
                    if engine.kind == "vllm" and model.latency.ttft_s.p95 is None:
                        return None
                    if model.name == "ensemble" and model.latency.e2e_s.mean is None:
                        return None
        return snaps

    snaps = wait_until(filled, timeout=20, interval=0.5, what="windowed latency")
    models = [(e, m) for s in snaps.values() for e in s.engines for m in e.models]
    ensemble = [m for e, m in models if m.name == "ensemble"]
    assert ensemble and all(m.latency.e2e_s.source == "mean" for m in ensemble)
    assert all(m.latency.ttft_s.mean for m in ensemble)  # from Triton's response statistics
    vllm = [m for e, m in models if e.kind == "vllm"]
    assert all(m.latency.itl_s.p95 and m.request_rate for m in vllm)
    assert all(m.kv_cache_usage is not None and m.requests_running is not None for m in vllm)


def test_a_token_is_needed_for_snapshots(demo):
    agent = load_fleet(demo.fleet).nodes[0].agent
    assert demo.get(f"{agent}/v1/snapshot", token=None).status_code == 401
    assert demo.get(f"{agent}/v1/snapshot", token="wrong-token-x").status_code == 401
    assert demo.get(f"{agent}/healthz", token=None).status_code == 200


def _deployment(demo: SimFleet, engine: str):
    fleet = load_fleet(demo.fleet)
    return next((m.name, d) for m in fleet.models for d in m.deployments if d.engine == engine)


def test_vllm_streams_openai_completions(demo):
    model, dep = _deployment(demo, "vllm")
    body = {"model": model, "prompt": "hello", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{dep.endpoint}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert len(events) == 4
    chat = httpx.post(
        f"{dep.endpoint}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=30,
    ).json()
    assert chat["choices"][0]["message"]["content"]
    assert chat["usage"]["completion_tokens"] == 2


def test_triton_streams_generate(demo):
    _, dep = _deployment(demo, "triton")
    body = {"text_input": "hello", "max_tokens": 3, "stream": True}
    url = f"{dep.endpoint}/v2/models/ensemble/generate_stream"
    with httpx.stream("POST", url, json=body, timeout=30) as resp:
        assert resp.status_code == 200
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert len(events) == 3 and '"text_output"' in events[0]


def test_sigterm_stops_the_fleet_and_its_stand_in_processes(tmp_path):
    sim = start_sim(tmp_path, "--nodes", "1")
    agent = load_fleet(sim.fleet).nodes[0].agent
    snap = Snapshot.model_validate_json(sim.get(f"{agent}/v1/snapshot").content)
    pids = [e.pid for e in snap.engines if e.pid]
    assert pids and all(psutil.pid_exists(p) for p in pids)
    started = time.monotonic()
    assert end(sim) == 0
    assert time.monotonic() - started < 10
    assert not [p for p in pids if running(p)]  # exited (a zombie waits for init)
    with pytest.raises(httpx.ConnectError):
        sim.get(f"{agent}/healthz", timeout=2)


def test_the_demo_gives_the_web_view_a_viewer_token_that_reads_and_cannot_act(demo, tmp_path):
    """Issue 28 #4: the demo had one token, an operator token, which the web view drops:
    `serve --web` showed every node as "no token". The demo now declares a viewer token
    (derived from its operator token), which a web session gets for every node."""
    import json
    import os
    import subprocess
    import sys

    from console.core.config.load import parse_fleet
    from console.sim.fleetfile import VIEWER_TOKEN_ENV, viewer_token_for
    from console.tui.web.serve import session_environment
    from tests.sim.conftest import ROOT, TOKEN

    viewer = viewer_token_for(TOKEN)
    text = demo.fleet.read_text()
    server_env = {"ENGINEROOM_DEMO_TOKEN": TOKEN, VIEWER_TOKEN_ENV: viewer, "PATH": "/bin"}
    session, _ = session_environment(parse_fleet(text), server_env, "ENGINEROOM_WEB_TOKEN")
    assert session["ENGINEROOM_DEMO_TOKEN"] == viewer  # each node, and the gateway: viewer
    assert TOKEN not in session.values()

    # What a web session's console reads with: every node up, the gateway answering.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEROOM_")}
    env.update(session)

    def all_up() -> dict | None:
        done = subprocess.run(
            [sys.executable, "-m", "console.cli", "check", "--json", "--fleet", str(demo.fleet)],
            capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
        )  # fmt: skip
        report = json.loads(done.stdout)
        up = report["summary"]["nodes_up"] == len(report["nodes"])
        return report if up and report["gateway"]["error"] is None else None

    wait_until(all_up, 60, interval=1, what="every node up through the viewer token")
    # ... and nothing that acts.
    fleet = load_fleet(demo.fleet)
    agent, gateway = fleet.nodes[0].agent, fleet.gateway
    assert gateway is not None and gateway.url is not None
    headers = {"Authorization": f"Bearer {viewer}"}
    job = httpx.post(f"{agent}/v1/jobs", json={"kind": "engine.stop", "engine": "x"},
                     headers=headers, timeout=10)  # fmt: skip
    assert job.status_code == 403
    model = fleet.models[0]
    weights = {d.id: d.weight for d in model.deployments}
    put = httpx.put(f"{gateway.url}/admin/routes/{model.name}", json={"weights": weights},
                    headers=headers, timeout=10)  # fmt: skip
    assert put.status_code == 403
